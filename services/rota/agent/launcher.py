"""Runs one job command and records its exit, even if the agent that started it is gone.

The agent starts this as the leader of a new process group; the job inherits the group,
so the agent's Stop kills everything at once. The launcher writes the exit code to a
file (so a restarted agent can report it), and fences itself: when the agent's lease
file is older than the timeout, the agent is dead, the control plane will requeue the
job elsewhere, and this copy must not keep running.

Every job start pays for this process, so it imports as little as it can: no argparse,
pathlib or subprocess (posix_spawn and a pidfd do the same here), and `_signal` rather
than `signal` (whose enum import was a third of the start-up); the agent runs it without
site-packages (rota.agent.processes.LAUNCHER). About 20 ms of CPU instead of 90.

    python -I -S launcher.py --exit-file F --lease-file L --lease-timeout S [--cgroup P,...] -- COMMAND...

`--cgroup` names the `cgroup.procs` files of the job's cgroup (rota.agent.cgroups): the
launcher joins them before it starts the job, so the job never runs a moment outside its
limits; a launcher that cannot join does not start the job.
"""

from __future__ import annotations

import _signal  # the C module behind `signal`: see above
import os
import select
import sys
import time

TYPE_CHECKING = False  # typing's own flag without importing typing (mypy reads it the same)
if TYPE_CHECKING:
    from collections.abc import Callable

# How often the lease is checked while the job runs: every POLL_S, or a fifth of the lease
# timeout when that is shorter, so a fenced copy is gone soon after its lease lapses and
# well before the node (silent for the whole node timeout) can be declared dead.
POLL_S = 0.5
POLL_FRACTION = 0.2

FENCED_EXIT = 137
USAGE = ("usage: rota-launcher --exit-file F --lease-file L --lease-timeout SECONDS [--sched idle] [--cgroup PROCS,...]"
         " -- COMMAND...")
CGROUP_EXIT = 126


class Args:
    def __init__(self, exit_file: str, lease_file: str, lease_timeout: float, command: list[str],
                 idle: bool = False, cgroup_procs: list[str] | None = None) -> None:
        self.exit_file, self.lease_file, self.lease_timeout, self.command = exit_file, lease_file, lease_timeout, command
        self.idle = idle  # the job runs under SCHED_IDLE: a guest in another job's bubbles
        self.cgroup_procs = cgroup_procs or []  # the job's cgroup: joined before the job starts


def parse_args(argv: list[str]) -> Args:
    """The three options and an optional `--sched idle` (in any order, `--opt value` or
    `--opt=value`), then the command."""
    options: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0] != "--" and rest[0].startswith("--"):
        name, _, value = rest.pop(0).partition("=")
        if not value:
            if not rest:
                raise SystemExit(f"{USAGE}\n{name}: missing value")
            value = rest.pop(0)
        options[name] = value
    command = rest[1:] if rest[:1] == ["--"] else rest
    unknown = set(options) - {"--exit-file", "--lease-file", "--lease-timeout", "--sched", "--cgroup"}
    missing = {"--exit-file", "--lease-file", "--lease-timeout"} - set(options)
    if unknown or missing or not command:
        why = f"unknown {sorted(unknown)}" if unknown else f"missing {sorted(missing)}" if missing else "no command"
        raise SystemExit(f"{USAGE}\n{why}")
    try:
        timeout = float(options["--lease-timeout"])
    except ValueError:
        raise SystemExit(f"{USAGE}\n--lease-timeout: not a number") from None
    if options.get("--sched", "idle") != "idle":
        raise SystemExit(f"{USAGE}\n--sched: only 'idle' is known")
    cgroup = [p for p in options.get("--cgroup", "").split(",") if p]
    return Args(options["--exit-file"], options["--lease-file"], timeout, command, options.get("--sched") == "idle", cgroup)


def write_exit(path: str, code: int, why: str) -> None:
    tmp = os.path.splitext(path)[0] + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n{why}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # The agent's SIGTERM reaches the whole group; the launcher outlives the job to record it.
    # A handler (not SIG_IGN, which exec would pass on to the job) keeps the launcher alive.
    _signal.signal(_signal.SIGTERM, lambda _sig, _frame: None)
    if args.idle:  # inherited by the job: any other runnable process on the core goes first
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if not _join_cgroup(args):
        return CGROUP_EXIT
    try:
        pid = os.posix_spawnp(args.command[0], args.command, os.environ,
                              file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
    except OSError as exc:
        print(f"rota: cannot start {args.command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_exit(args.exit_file, 127, str(exc))
        return 127
    return supervise(args, pid)


def supervise(args: Args, pid: int) -> int:
    """Waits for the job `pid` (a child of this process), fencing it when the lease lapses,
    and records its exit. Also what a warm runtime runs once it forked the job
    (rota.agent.warm_runtime)."""
    wait = _exit_waiter(pid)
    poll_s = max(0.05, min(POLL_S, POLL_FRACTION * args.lease_timeout))
    while (code := wait(poll_s)) is None:
        if _lease_expired(args.lease_file, args.lease_timeout):
            print("rota: agent lease expired; stopping this copy of the job", file=sys.stderr, flush=True)
            write_exit(args.exit_file, FENCED_EXIT, "fenced: agent lease expired")
            os.killpg(os.getpgid(0), _signal.SIGKILL)
    # A job killed by a signal is recorded as 128 + the signal, as a shell (and the
    # fenced exit above) would report it; the raw negative returncode is not an exit code.
    exit_code = code if code >= 0 else 128 - code
    write_exit(args.exit_file, exit_code, "exited" if code >= 0 else f"signal {-code}")
    return exit_code


def _join_cgroup(args: Args) -> bool:
    """Moves the launcher into the job's cgroup (the job inherits it); False, with the exit
    recorded, when it cannot."""
    try:
        for procs in args.cgroup_procs:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        print(f"rota: cannot join the job's cgroup: {exc}", file=sys.stderr, flush=True)
        write_exit(args.exit_file, CGROUP_EXIT, f"cgroup: {exc}")
        return False
    return True


def _exit_waiter(pid: int) -> Callable[[float], int | None]:
    """wait(timeout_s): the child's exit status (negative: killed by that signal), or None
    if it still runs after timeout_s. Sleeps in poll(2) on a pidfd (Linux 5.3 and later);
    elsewhere polls waitpid every 50 ms."""
    try:
        poller = select.poll()
        poller.register(os.pidfd_open(pid), select.POLLIN)
    except (AttributeError, OSError):
        poller = None

    def wait(timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while True:
            if poller is not None:
                poller.poll(timeout_s * 1000)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if poller is not None or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    return wait


def _lease_expired(lease: str, timeout: float) -> bool:
    try:
        return time.time() - os.stat(lease).st_mtime > timeout
    except FileNotFoundError:
        return True


if __name__ == "__main__":
    sys.exit(main())
