"""A tuning trial job: B fused surrogate trials of a byte-level LM on the standard library's sources.

    python examples/trial_fused.py --steps 200 [--fusion 4] [--scale 8]

Submitted as ``kind: trial`` (examples/trial-guest.yaml), the allocator runs it on free
GPUs, or, when none is free, as a guest in the pipeline bubbles of a running job that
reports them (examples/pipeline-host.yaml): there it runs at idle priority and only while
the host's stage waits. Either way it reports every step through ``rota.runtime.report``
(step, the fused trials' losses, whether it runs as a guest).
"""

from __future__ import annotations

import argparse
import warnings

import torch

import rota.runtime
from rota.tuning.fused import FusedTrials, TrialHparams
from rota.tuning.lm import TinyLM, stdlib_batches
from rota.tuning.scaling import scale_width


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="B fused surrogate trials of a tiny LM")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--fusion", type=int, default=4, help="trials trained as one batched computation")
    parser.add_argument("--scale", type=int, default=8, help="width divisor of the surrogate")
    args = parser.parse_args(argv)
    for name in ("steps", "fusion", "scale"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name}: must be positive")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = TinyLM(width=64, layers=2, heads=2, context=32)
    fused = FusedTrials([scale_width(base, args.scale, seed=i) for i in range(args.fusion)],
                        [TrialHparams(lr=1e-2 * (i + 1)) for i in range(args.fusion)])
    data = stdlib_batches(seed=0, batch=8, context=32, max_bytes=300_000)
    guest = rota.runtime.guest_of()
    for step in range(1, args.steps + 1):
        losses = fused.step(data.next())
        if step % 10 == 0 or step == args.steps:
            rota.runtime.report(step=step, losses=[round(float(v), 4) for v in losses], guest_of=guest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
