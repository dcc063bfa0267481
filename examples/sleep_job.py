"""A long, idle job: it reports progress once a second for ``--seconds`` and exits 0.

Used by tests of cancel, pause and node death. On SIGTERM (or SIGINT) it stops within a
fraction of a second and exits with 128 + the signal number (143 for SIGTERM), so a
process that was told to stop is never mistaken for one that finished.

It is pausable: it registers with ``rota.runtime.Checkpointer`` (its state is its step, so
it never imports torch) and reaches a safe point every ``SAFE_POINT_S``, so ``rota pause``
stops it within a fraction of a second and a resumed copy continues from the step it
paused at. ``--no-checkpoint`` leaves it unregistered (a job that cannot be paused).

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

SAFE_POINT_S = 0.05  # how often it checks for a pause request: a stat, a few microseconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="report progress once a second for N seconds")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reports (default 1)")
    p.add_argument("--exit-code", type=int, default=0, help="exit status after the last second (default 0)")
    p.add_argument("--no-checkpoint", action="store_true", help="do not register with rota.runtime: not pausable")
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
    ckpt = None if args.no_checkpoint else rota.runtime.Checkpointer()
    step = ckpt.restore() if ckpt is not None else 0
    if step:
        print(f"sleep_job: resumed at step {step}", flush=True)
    start = time.monotonic() - step * args.interval
    rota.runtime.report(step=step, total=total)
    while step < total:
        # Wait until the next whole interval, measured from the start so reports do not
        # drift, serving pause requests in between.
        due = start + (step + 1) * args.interval
        while not stop.is_set() and time.monotonic() < due:
            if stop.wait(max(0.0, min(SAFE_POINT_S, due - time.monotonic()))):
                break
            if ckpt is not None:
                ckpt.safe_point(step)  # a committed pause exits here (status 0); a resume continues at `step`
        if stop.is_set():
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
