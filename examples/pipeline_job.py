"""A simulated 3-D parallel training job that reports its iterations to the failure detector.

Each iteration, every data-parallel replica packs long-tailed sequence lengths into
micro-batches; a rank's busy time is what its stage's share of the model costs on them
(α·tokens + β·Σ l², plus 3% noise), so raw times swing with the sequences while the
detector's model explains them. It calls ``rota.runtime.report_iteration`` once per
iteration (which also beats every rank's heartbeat) and ``rota.runtime.report`` for progress.

    python examples/pipeline_job.py --iterations 200 --slow-rank 5 --slow-factor 1.3 --slow-from 100
    python examples/pipeline_job.py --hang-at 150     # ranks stop beating: a hung job

``--hang-at N``: after iteration N the job goes quiet (no reports, no heartbeats) but keeps
running, as a job stuck in a collective would; the detector declares its ranks dead.

``--checkpoint``: the job registers its state with ``rota.runtime.Checkpointer`` (it can be
paused, migrated and re-planned) and continues from its image's iteration when restored.
Submitted with ``accepts_layout_changes: true``, it reads a re-planned layout from
``rota.runtime.layout()`` at start-up and runs it: each stage's cost follows the layers the
plan gives it, and ranks the plan leaves idle report no time. (The batch split stays as it
was: an iteration report holds the same number of micro-batches for every replica.)
``--layout-out FILE`` appends one JSON line per start: the epoch, the first iteration and
the layout it runs with (null: its own).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from typing import Any

import rota.runtime

STAGE_SECONDS = 0.06  # one full micro-batch of short sequences on one stage
CROSSOVER = 8192  # tokens at which attention costs as much as the rest


def pack(rng: random.Random, budget: int, median: float, sigma: float, longest: int) -> list[int]:
    """One micro-batch: sequences until the next one would overflow the token budget."""
    out: list[int] = []
    while True:
        n = min(longest, max(1, round(rng.lognormvariate(math.log(median), sigma))))
        if out and sum(out) + n > budget:
            return out
        out.append(n)
        if sum(out) >= budget:
            return out


class RandomState:
    """The generator of sequence lengths and noise as checkpointable state."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["state"])


def stage_scale(plan: dict[str, Any] | None, pp: int, dp: int) -> list[list[float]]:
    """Each replica's stage cost relative to an equal split of the layers (1.0 without a plan)."""
    if plan is None:
        return [[1.0] * pp for _ in range(dp)]
    per_stage = plan["layers"] / pp
    layers = plan["layers_per_stage"]
    return [[layers[d * pp + s] / per_stage for s in range(pp)] for d in range(dp)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="simulated pipeline-parallel training that reports iterations")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16384, help="tokens per micro-batch")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank runs --slow-factor times slower ...")
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--slow-from", type=int, default=0, help="... from this iteration on")
    p.add_argument("--hang-at", type=int, default=-1, help="go quiet after this iteration (a hung job)")
    p.add_argument("--pace", type=float, default=0.02, help="real seconds per iteration")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint", action="store_true", help="register the state: pausable, continues from its image")
    p.add_argument("--layout-out", default="", help="append the layout of every start to this file (JSON lines)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    ranks = args.tp * args.pp * args.dp
    alpha = [STAGE_SECONDS * (1.0 + 0.15 * (s == args.pp - 1)) / args.tokens for s in range(args.pp)]
    plan = rota.runtime.layout()
    scale = stage_scale(plan, args.pp, args.dp)
    idle = set(plan["idle_ranks"]) if plan is not None else set()
    ckpt = rota.runtime.Checkpointer(data=RandomState(rng)) if args.checkpoint else None
    start = ckpt.restore() if ckpt is not None else 0
    if args.layout_out:
        with open(args.layout_out, "a") as out:
            out.write(json.dumps({"epoch": rota.runtime.job_context().epoch, "start": start, "layout": plan}) + "\n")
    print(f"starting at iteration {start} with {'a re-planned' if plan else 'its own'} layout", flush=True)
    for it in range(start, args.iterations):
        if it == args.hang_at:
            print(f"iteration {it}: hanging (no more reports or heartbeats)", flush=True)
            time.sleep(3600)
        micro = [[pack(rng, args.tokens, 2048, 1.0, 32768) for _ in range(args.microbatches)] for _ in range(args.dp)]
        seconds: list[float | None] = []
        for r in range(ranks):
            s, d = r // args.tp % args.pp, r // (args.tp * args.pp)
            cost = scale[d][s] * sum(alpha[s] * (sum(mb) + sum(n * n for n in mb) / CROSSOVER) for mb in micro[d])
            slow = args.slow_factor if r == args.slow_rank and it >= args.slow_from else 1.0
            noise = rng.gauss(1.0, 0.03)
            seconds.append(None if r in idle else cost * slow * noise)
        rota.runtime.report_iteration(it, rank_seconds=seconds, micro_batches=micro, tp=args.tp, pp=args.pp, dp=args.dp)
        rota.runtime.report(step=it + 1)
        if ckpt is not None:
            ckpt.safe_point(it + 1)  # serves a pause: the process exits here, the image holds it + 1
        time.sleep(args.pace)
    print(f"done: {args.iterations} iterations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
