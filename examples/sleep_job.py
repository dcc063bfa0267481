"""A long, idle job: it reports progress once a second for ``--seconds`` and exits 0.

Used by tests of cancel, pause and node death. On SIGTERM (or SIGINT) it stops within a
fraction of a second and exits with 128 + the signal number (143 for SIGTERM), so a
process that was told to stop is never mistaken for one that finished.

    python examples/sleep_job.py --seconds 60
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
from types import FrameType

import rota.runtime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="report progress once a second for N seconds")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reports (default 1)")
    p.add_argument("--exit-code", type=int, default=0, help="exit status after the last second (default 0)")
    args = p.parse_args(argv)

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    ctx = rota.runtime.job_context()
    print(f"sleep_job: pid={os.getpid()} job={ctx.job_id or '-'} seconds={args.seconds}", flush=True)
    if args.seconds < 0 or args.interval <= 0:
        p.error("--seconds must be >= 0 and --interval > 0")
    total = math.ceil(args.seconds / args.interval - 1e-9)
    start = time.monotonic()
    step = 0
    rota.runtime.report(step=0, total=total)
    while step < total:
        # Wait until the next whole interval, measured from the start so reports do not drift.
        if stop.wait(max(0.0, start + (step + 1) * args.interval - time.monotonic())):
            break
        step += 1
        rota.runtime.report(step=step, total=total)
        print(f"sleep_job: {step}/{total}", flush=True)

    if received:
        name = signal.Signals(received[0]).name
        print(f"sleep_job: received {name} at step {step}, exiting", flush=True)
        return 128 + received[0]
    print("sleep_job: done", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
