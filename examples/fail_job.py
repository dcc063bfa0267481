"""A job that fails: it prints a few lines, reports a little progress, then raises.

Used to check that a failing job reaches FAILED with its error (the last log lines).

    python examples/fail_job.py
"""

from __future__ import annotations

import argparse
import sys
import time

import rota.runtime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a job that fails on purpose")
    p.add_argument("--steps-before-failure", type=int, default=3)
    p.add_argument("--shard", type=int, default=3, help="the shard named in the error")
    p.add_argument("--delay", type=float, default=0.1, help="seconds between steps")
    args = p.parse_args(argv)

    print("fail_job: loading shards", flush=True)
    for step in range(1, args.steps_before_failure + 1):
        time.sleep(args.delay)
        rota.runtime.report(step=step)
        print(f"fail_job: step {step} ok", flush=True)
    raise RuntimeError(f"simulated failure: bad shard {args.shard}")


if __name__ == "__main__":
    sys.exit(main())
