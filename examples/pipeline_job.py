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
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

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
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    ranks = args.tp * args.pp * args.dp
    alpha = [STAGE_SECONDS * (1.0 + 0.15 * (s == args.pp - 1)) / args.tokens for s in range(args.pp)]
    for it in range(args.iterations):
        if it == args.hang_at:
            print(f"iteration {it}: hanging (no more reports or heartbeats)", flush=True)
            time.sleep(3600)
        micro = [[pack(rng, args.tokens, 2048, 1.0, 32768) for _ in range(args.microbatches)] for _ in range(args.dp)]
        seconds = []
        for r in range(ranks):
            s, d = r // args.tp % args.pp, r // (args.tp * args.pp)
            cost = sum(alpha[s] * (sum(mb) + sum(n * n for n in mb) / CROSSOVER) for mb in micro[d])
            slow = args.slow_factor if r == args.slow_rank and it >= args.slow_from else 1.0
            seconds.append(cost * slow * rng.gauss(1.0, 0.03))
        rota.runtime.report_iteration(it, rank_seconds=seconds, micro_batches=micro, tp=args.tp, pp=args.pp, dp=args.dp)
        rota.runtime.report(step=it + 1)
        time.sleep(args.pace)
    print(f"done: {args.iterations} iterations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
