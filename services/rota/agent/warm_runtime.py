"""A warm runtime: a Python process the agent starts before any job needs it, with the
heavy imports done (torch, rota.runtime), that is handed the next job instead of a cold
interpreter, in the spirit of FlowGPU's ghost process. A restore or a migration's target
then starts in milliseconds, not in the seconds an interpreter and torch take (most of a
small restore on a busy node).

Handing a job over: the agent writes one JSON line to the warm process's stdin (the
launcher's arguments, the job's environment, folder and log). The warm process points its
output at the job's log, takes the job's environment and folder, and forks: the child runs
the job's module or script in the warmed interpreter (runpy, as `python -m` or `python
script.py` would); the parent becomes the job's launcher (rota.agent.launcher.supervise:
lease fencing, the exit file). It is the agent's child and the leader of the job's process
group, as the cold launcher is, so the process table tracks both alike.

Only a command run by the warm process's own interpreter as `-m MODULE` or `SCRIPT.py`, with
the same PYTHONPATH (read once, at interpreter start), takes the warm path; anything else
starts cold. While it waits, the warm process runs at idle priority, so warming the next
one never takes CPU from a running job.

    python -m rota.agent.warm_runtime [--preload torch,rota.runtime] [--normal-priority]

A benchmark that must not wait on idle-priority imports (a busy machine gives them no CPU)
builds its pool with `idle=False` and `refill=False`: it warms at normal priority and only
when the bench calls `start()`, between the arms it times.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rota.agent import launcher

# torch._dynamo: torch.optim imports it when the first optimizer is built, as long as torch
# itself takes (about 1.8 s of CPU here): a job's start pays it unless the runtime has.
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch._dynamo", "rota.runtime")
# What the interpreter reads once at start: a job that sets them differently starts cold.
START_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "LD_PRELOAD", "LD_LIBRARY_PATH")


def eligible(command: list[str], env: Mapping[str, str], warm_env: Mapping[str, str]) -> bool:
    """Whether the warm path can run `command` as a cold interpreter would."""
    if len(command) < 2 or Path(command[0]).resolve() != Path(sys.executable).resolve():
        return False
    if any(env.get(k, "") != warm_env.get(k, "") for k in START_ONLY_ENV):
        return False
    return (command[1] == "-m" and len(command) >= 3) or command[1].endswith(".py")


class WarmPool:
    """The node's warm process, started ahead of the next job and replaced once it is taken."""

    def __init__(self, env: Mapping[str, str], preload: tuple[str, ...] = DEFAULT_PRELOAD, *, idle: bool = True,
                 refill: bool = True) -> None:
        self.env = dict(env)
        self.preload = preload
        self.idle = idle  # warm at idle priority
        self.refill = refill  # start the next warm process as soon as one is handed a job
        self.ready: subprocess.Popen[bytes] | None = None
        self.handed = 0

    def start(self) -> None:
        if self.ready is None or self.ready.poll() is not None:
            self.ready = subprocess.Popen(
                [sys.executable, "-m", "rota.agent.warm_runtime", "--preload", ",".join(self.preload),
                 *([] if self.idle else ["--normal-priority"])],
                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd="/",
            )

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the warm process has its imports done (waiting up to `timeout_s`)."""
        self.start()
        assert self.ready is not None and self.ready.stdout is not None
        readable, _, _ = select.select([self.ready.stdout], [], [], timeout_s)
        return bool(readable)

    def launch(self, launcher_argv: list[str], command: list[str], env: Mapping[str, str], cwd: str,
               log: Path) -> subprocess.Popen[bytes] | None:
        """Hands the job to the warm process (None: not eligible, or none is up); starts the next."""
        if not eligible(command, env, self.env):
            return None
        self.start()
        popen, self.ready = self.ready, None
        assert popen is not None and popen.stdin is not None and popen.stdout is not None
        popen.stdout.close()
        log.touch()  # there from the launch on, as a cold launch's
        spec = {"launcher": launcher_argv, "env": dict(env), "cwd": cwd, "log": str(log)}
        try:
            popen.stdin.write(json.dumps(spec).encode() + b"\n")
            popen.stdin.close()
        except OSError:  # it died while waiting: the job starts cold
            return None
        self.handed += 1
        if self.refill:
            self.start()
        return popen

    def close(self) -> None:
        if self.ready is not None and self.ready.poll() is None:
            self.ready.kill()
            self.ready.wait()
        self.ready = None


def run_command(command: list[str]) -> int:
    """What `python -m MODULE ARGS` or `python SCRIPT ARGS` would do, in this interpreter."""
    try:
        if command[1] == "-m":
            sys.argv = [command[2], *command[3:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command[1:]
            sys.path.insert(0, str(Path(command[1]).resolve().parent))
            runpy.run_path(command[1], run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a job's failure is its exit code, as in a cold interpreter
        traceback.print_exc()
        return 1
    return 0


def take_job(spec: dict[str, Any]) -> int:
    """Becomes the job's launcher: its log, environment and folder, a forked child running it."""
    log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(spec["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    args = launcher.parse_args(list(spec["launcher"]))
    if os.environ.get("PYTHONUNBUFFERED"):  # read at start by a cold interpreter
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    try:  # out of the warming's idle class (a guest's job stays there, as the launcher puts it)
        os.sched_setscheduler(0, os.SCHED_IDLE if args.idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        print(f"rota: the warm runtime keeps idle priority: {exc}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: None)  # the launcher outlives the job to record it
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = run_command(args.command)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return launcher.supervise(args, pid)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    if argv[:1] == ["--preload"] and len(argv) > 1:
        preload = tuple(m for m in argv[1].split(",") if m)
    try:
        if "--normal-priority" not in argv:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # warming never delays a running job
    except OSError:
        pass
    for module in preload:
        importlib.import_module(module)
    try:
        os.write(1, b"ready\n")  # WarmPool.wait_ready; the job's log replaces this pipe
    except BrokenPipeError:
        pass  # handed a job before it was ready: the agent no longer listens
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # the agent closed it unused
    return take_job(json.loads(line))


if __name__ == "__main__":
    sys.exit(main())
