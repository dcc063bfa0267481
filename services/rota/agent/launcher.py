"""Runs one job command and records its exit, even if the agent that started it is gone.

The agent starts this as the leader of a new process group; the job inherits the group,
so the agent's Stop kills everything at once. The launcher writes the exit code to a
file (so a restarted agent can report it), and fences itself: when the agent's lease
file is older than the timeout, the agent is dead, the control plane will requeue the
job elsewhere, and this copy must not keep running.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FENCED_EXIT = 137


def write_exit(path: Path, code: int, why: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{code}\n{why}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rota-launcher")
    parser.add_argument("--exit-file", type=Path, required=True)
    parser.add_argument("--lease-file", type=Path, required=True)
    parser.add_argument("--lease-timeout", type=float, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # The agent's SIGTERM reaches the whole group; the launcher outlives the job to record it.
    # A handler (not SIG_IGN, which exec would pass on to the job) keeps the launcher alive.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: None)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"rota: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_exit(args.exit_file, 127, str(exc))
        return 127
    while True:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if _lease_expired(args.lease_file, args.lease_timeout):
            print("rota: agent lease expired; stopping this copy of the job", file=sys.stderr, flush=True)
            write_exit(args.exit_file, FENCED_EXIT, "fenced: agent lease expired")
            os.killpg(os.getpgid(0), signal.SIGKILL)
    # A job killed by a signal is recorded as 128 + the signal, as a shell (and the
    # fenced exit above) would report it; the raw negative returncode is not an exit code.
    exit_code = code if code >= 0 else 128 - code
    write_exit(args.exit_file, exit_code, "exited" if code >= 0 else f"signal {-code}")
    return exit_code


def _lease_expired(lease: Path, timeout: float) -> bool:
    try:
        return time.time() - lease.stat().st_mtime > timeout
    except FileNotFoundError:
        return True


if __name__ == "__main__":
    sys.exit(main())
