"""`srun` inside an sbatch job: launches the step's tasks on this node with their SLURM_PROCID,
SLURM_LOCALID and --output/--error files, forwards signals to them, and exits with the
highest task status. It registers itself in the job's spool folder, so the launcher's
--signal and `scancel --signal` reach the step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from rota.slurm import directives, relay, spool
from rota.slurm.patterns import expand

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCONT, signal.SIGHUP)
_VALUED = {"output": "o", "error": "e", "ntasks": "n", "nodes": "N", "ntasks-per-node": "", "job-name": "J",
           "cpus-per-task": "c", "gres": "", "gpus": "G"}
_FLAGS = {"unbuffered": "u", "label": "l", "exclusive": "", "overlap": "", "kill-on-bad-exit": "K"}


class StepError(ValueError):
    """An srun option or situation Rota's srun refuses: the message names it."""


def parse(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    shorts = {s: n for n, s in {**_VALUED, **_FLAGS}.items() if s}
    options: dict[str, str] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        argument = argv[index]
        if argument == "--":
            index += 1
            break
        if argument.startswith("--"):
            name, equals, value = argument[2:].partition("=")
        else:
            name, value = shorts.get(argument[1:2], argument[1:2]), argument[2:]
            equals = "=" if value else ""
        if name in _FLAGS:
            options[name] = ""
        elif name in _VALUED:
            if not equals:
                index += 1
                value = argv[index] if index < len(argv) else ""
            options[name] = value
        else:
            raise StepError(f"{argument}: option not supported by Rota's srun")
        index += 1
    return options, list(argv[index:])


def tasks_per_node(options: dict[str, str], env: dict[str, str]) -> int:
    """Each node's tasks: a step runs on every node of the job (Slurm's default)."""
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    if int(options.get("nodes", str(nodes)).split("-")[0]) != nodes:
        raise StepError(f"--nodes: a step runs on all {nodes} nodes of the job in Rota's srun")
    if "ntasks" in options:
        total = int(options["ntasks"])
        if total % nodes:
            raise StepError(f"--ntasks: {total} tasks do not divide evenly over {nodes} nodes")
        return total // nodes
    return int(options.get("ntasks-per-node", env.get("SLURM_NTASKS_PER_NODE", "1")))


def _stream(pattern: str, env: dict[str, str], task: int) -> int | None:
    if not pattern:
        return None
    path = Path(expand(pattern, env, task=task))
    path.parent.mkdir(parents=True, exist_ok=True)
    append = os.O_APPEND if env.get("SLURM_OPEN_MODE", "a") == "a" else os.O_TRUNC
    return os.open(path, os.O_WRONLY | os.O_CREAT | append, 0o644)


def launch(options: dict[str, str], command: list[str], env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    count = tasks_per_node(options, env)
    node = int(env.get("SLURM_NODEID", "0"))
    step = env.get("SLURM_STEP_ID", "0")
    processes = []
    for local in range(count):
        task_env = {**env, "SLURM_PROCID": str(node * count + local), "SLURM_LOCALID": str(local),
                    "SLURM_STEP_ID": step, "SLURM_STEPID": step, "SLURM_STEP_NUM_TASKS": str(count)}
        if "ntasks" in options:
            task_env["SLURM_NTASKS"] = options["ntasks"]
        out = _stream(options.get("output", ""), task_env, node * count + local)
        err = _stream(options.get("error", ""), task_env, node * count + local) if options.get("error") else out
        processes.append(subprocess.Popen(command, env=task_env, stdout=out, stderr=err))
        for stream in {out, err} - {None}:
            os.close(stream)  # type: ignore[arg-type]
    return processes


def srun(argv: list[str]) -> int:
    env = dict(os.environ)
    if "SLURM_JOB_ID" not in env or "ROTA_SLURM_JOB" not in env:
        raise StepError("outside an sbatch job (no SLURM_JOB_ID): Rota runs no interactive jobs; use sbatch")
    options, command = parse(argv)
    if not command:
        raise directives.DirectiveError("no command to run")
    registry = spool.job_folder(spool.root(), env["ROTA_SLURM_JOB"]) / "steps"
    registry.mkdir(parents=True, exist_ok=True)
    mine = registry / str(os.getpid())
    mine.touch()
    processes: list[subprocess.Popen[bytes]] = []

    def forward(number: int, _frame: FrameType | None) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(number)

    for number in FORWARDED:
        signal.signal(number, forward)
    try:
        request = relay.ask_other_nodes(options, command, env)
        processes += launch(options, command, env)
        codes = [p.wait() for p in processes]
        codes += relay.wait_other_nodes(request, env)
    finally:
        mine.unlink(missing_ok=True)
    return max((c if c >= 0 else 128 - c for c in codes), default=0)


if __name__ == "__main__":
    sys.exit(srun(sys.argv[1:]))
