"""A tuning trial job: B fused surrogate trials of a byte-level LM on the standard library's sources.

    python examples/trial_fused.py --steps 200 [--fusion 4] [--scale 8] [--losses FILE]

Submitted as ``kind: trial`` (examples/trial-guest.yaml), the allocator runs it on free
GPUs, or, when none is free, as a guest in the pipeline bubbles of a running job that
reports them (examples/pipeline-host.yaml): there it runs at idle priority and only while
the host's stage waits. Either way it reports every step through ``rota.runtime.report``
(step, the fused trials' losses, whether it runs as a guest).

It is pausable: the fused trials (weights, optimizer state, hyperparameters) and the data's
generator are registered with ``rota.runtime.Checkpointer``, with a safe point after every
step, so a paused trial resumes from its state and its losses continue exactly as an
uninterrupted run's (``--losses`` writes them, one line a step).
"""

from __future__ import annotations

import argparse
import warnings

import torch

import rota.runtime
from rota.jobkit.tuning.fused import FusedTrials, TrialHparams
from rota.jobkit.tuning.lm import TinyLM, stdlib_batches
from rota.jobkit.tuning.scaling import scale_width


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="B fused surrogate trials of a tiny LM")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--fusion", type=int, default=4, help="trials trained as one batched computation")
    parser.add_argument("--scale", type=int, default=8, help="width divisor of the surrogate")
    parser.add_argument("--losses", default=None, help="append each step's losses to this file")
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
    ckpt = rota.runtime.Checkpointer(trials=fused, data=data.generator)
    done = ckpt.restore()
    guest = rota.runtime.guest_of()
    for step in range(done + 1, args.steps + 1):
        losses = fused.step(data.next())
        if args.losses:
            with open(args.losses, "a", encoding="utf-8") as f:
                f.write(" ".join(f"{float(v):.9g}" for v in losses) + "\n")
        if step % 10 == 0 or step == args.steps:
            rota.runtime.report(step=step, losses=[round(float(v), 4) for v in losses], guest_of=guest)
        ckpt.safe_point(step)  # a committed pause exits here; a resumed copy continues after `step`
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
