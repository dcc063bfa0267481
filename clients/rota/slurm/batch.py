"""Runs an sbatch script inside a Rota job, as slurmd runs a batch step: `python -m
rota.slurm.batch FLAGS -- SCRIPT_CHUNKS...` (rota.slurm.translate writes the command).

It sets Slurm's variables from the agent's ROTA_* ones, sends --output/--error where they
point, delivers --signal before the time limit and kills the script at it (TIMEOUT), delivers
`scancel --signal` requests, and turns `scontrol requeue` into another run: it exits with
REQUEUE_EXIT and Rota's restart policy (on-failure, set by sbatch) queues the job again.
A run that failed on its own writes `final`, so Rota's retries replay its end, not the script.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rota.slurm import ids, relay, spool
from rota.slurm.patterns import expand
from rota.slurm.translate import seconds_of_time, signal_of

REQUEUE_EXIT = 75  # EX_TEMPFAIL: the run asked to be requeued
TIMEOUT_EXIT = 124
KILL_WAIT_S = 8.0  # Slurm's KillWait: SIGTERM at the time limit, SIGKILL this much later (ours; under the agent's 10 s)
LIMIT_SLACK_S = 5.0  # a SIGTERM this close to the time limit is the agent's time_limit stop: TIMEOUT
REQUEUE_GRACE_S = 5.0  # after `scontrol requeue`, the script's time to exit by itself (submitit exits at once)
POLL_S = 0.2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rota.slurm.batch")
    parser.add_argument("--spool", required=True)
    parser.add_argument("--script-name", default="sbatch")
    parser.add_argument("--ntasks-per-node", type=int, default=1)
    parser.add_argument("--submit-dir", default="")
    for option in ("output", "error", "open-mode", "signal", "time", "job-name", "account", "partition",
                   "cpus-per-task"):
        parser.add_argument(f"--{option}", default="")
    parser.add_argument("chunks", nargs="*")
    return parser


@dataclass
class Run:
    folder: Path
    process: subprocess.Popen[bytes]
    limit_s: float | None
    warn: tuple[str, int, bool] | None
    started: float = field(default_factory=time.monotonic)
    warned: bool = False
    timed_out: bool = False
    term_at: float | None = None
    requeued_at: float | None = None


def slurm_environment(args: argparse.Namespace, restarts: int) -> dict[str, str]:
    """Slurm's variables for the batch step (and, through it, for `srun`)."""
    job = os.environ["ROTA_JOB_ID"]
    nodes = [n for n in os.environ.get("ROTA_GANG_NODES", "").split(",") if n] or [os.environ.get("ROTA_NODE", "")]
    number = ids.slurm_id(os.environ["ROTA_ARRAY_ID"] if os.environ.get("ROTA_ARRAY_ID") else job)
    tasks = args.ntasks_per_node * len(nodes)
    gpus = os.environ.get("ROTA_GPUS", "")
    env = {
        "SLURM_JOB_ID": number, "SLURM_JOBID": number, "SLURM_JOB_NAME": args.job_name or args.script_name,
        "SLURM_JOB_NODELIST": ids.compress_nodes(nodes), "SLURM_NODELIST": ids.compress_nodes(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_NODEID": os.environ.get("NODE_RANK", "0"), "SLURMD_NODENAME": os.environ.get("ROTA_NODE", ""),
        "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
        "SLURM_NTASKS_PER_NODE": str(args.ntasks_per_node),
        "SLURM_TASKS_PER_NODE": f"{args.ntasks_per_node}(x{len(nodes)})" if len(nodes) > 1 else str(args.ntasks_per_node),
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_RESTART_COUNT": str(restarts),
        "SLURM_SUBMIT_DIR": args.submit_dir, "SLURM_SUBMIT_HOST": socket.gethostname(),
        "SLURM_CLUSTER_NAME": "rota", "SLURM_JOB_GPUS": gpus, "SLURM_GPUS_ON_NODE": str(len([g for g in gpus.split(",") if g])),
        "SLURM_OPEN_MODE": "t" if args.open_mode == "truncate" else "a",
        "ROTA_SLURM_SPOOL": args.spool, "ROTA_SLURM_JOB": job,
    }
    if os.environ.get("ROTA_ARRAY_ID"):
        env["SLURM_ARRAY_JOB_ID"] = number
        env["SLURM_ARRAY_TASK_ID"] = os.environ.get("ROTA_ARRAY_INDEX", "0")
    optional = {"SLURM_JOB_ACCOUNT": args.account, "SLURM_JOB_PARTITION": args.partition,
                "SLURM_CPUS_PER_TASK": args.cpus_per_task}
    env.update({k: v for k, v in optional.items() if v})
    return env


def _open(pattern: str, env: dict[str, str], default: str) -> int:
    path = Path(expand(pattern or default, env, task=0))
    if not path.is_absolute():
        path = Path(env.get("SLURM_SUBMIT_DIR") or ".") / path
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if env["SLURM_OPEN_MODE"] == "a" else os.O_TRUNC)
    return os.open(path, flags, 0o644)


def start(args: argparse.Namespace, folder: Path, env: dict[str, str]) -> Run:
    script = folder / "script"
    script.write_text("".join(args.chunks))
    script.chmod(0o700)
    default = "slurm-%A_%a.out" if "SLURM_ARRAY_TASK_ID" in env else "slurm-%j.out"
    out = _open(args.output, env, default)
    err = _open(args.error, env, default) if args.error else out
    command = [str(script)] if "".join(args.chunks).startswith("#!") else ["/bin/sh", str(script)]
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                               start_new_session=True, cwd=os.getcwd())
    os.close(out)
    if err != out:
        os.close(err)
    limit = seconds_of_time(args.time) if args.time else None
    return Run(folder, process, float(limit) if limit else None, signal_of(args.signal) if args.signal else None)


def deliver(run: Run, name: str, target: str) -> None:
    """A signal to the job's steps (each `srun` forwards it to its tasks), its batch shell, or both."""
    number = int(name) if name.isdigit() else int(getattr(signal, "SIG" + name))
    pids: list[int] = []
    if target in ("steps", "all"):
        steps = run.folder / "steps"
        pids += [int(p.name) for p in steps.iterdir()] if steps.is_dir() else []
    for pid in pids:
        _kill(pid, number)
    if target in ("batch", "all"):
        _kill(-run.process.pid, number)


def _kill(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass  # ended meanwhile


def terminate(run: Run) -> None:
    """SIGTERM to everything of the run once; SIGKILL KILL_WAIT_S later (tick)."""
    if run.term_at is None:
        deliver(run, "TERM", "all")
        run.term_at = time.monotonic()


def tick(run: Run) -> None:
    now = time.monotonic() - run.started
    for name, target in spool.take_signals(run.folder):
        deliver(run, name, target)
    if run.requeued_at is None and (run.folder / "requeue").exists():
        run.requeued_at = time.monotonic()
    if run.requeued_at is not None and time.monotonic() - run.requeued_at >= REQUEUE_GRACE_S:
        terminate(run)
    if run.limit_s is not None and run.warn is not None and not run.warned and now >= run.limit_s - run.warn[1]:
        run.warned = True
        deliver(run, run.warn[0], "batch" if run.warn[2] else "steps")
    if run.limit_s is not None and now >= run.limit_s and run.term_at is None:
        run.timed_out = True
        terminate(run)
    if run.term_at is not None and time.monotonic() - run.term_at >= KILL_WAIT_S:
        deliver(run, "KILL", "all")


def finish(run: Run, code: int) -> int:
    """The launcher's exit status for Rota, recording a final end Rota's retries must replay."""
    _kill(-run.process.pid, signal.SIGKILL)  # what the script left behind in its group
    if (run.folder / "requeue").exists():
        (run.folder / "requeue").unlink(missing_ok=True)
        print(f"rota-slurm: requeued (script exit {code})", file=sys.stderr)
        return REQUEUE_EXIT
    if run.timed_out:
        (run.folder / "final").write_text(f"TIMEOUT {TIMEOUT_EXIT}\n")
        print("rota-slurm: time limit reached; the script was stopped", file=sys.stderr)
        return TIMEOUT_EXIT
    if code != 0:
        (run.folder / "final").write_text(f"FAILED {code}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    job_role = relay.role()
    if job_role == "idle":
        return 0  # another GPU slot of a multi-node job: node rank 0's script and `srun` run the tasks
    if job_role == "serve":
        return relay.serve({**os.environ, **slurm_environment(args, 0)})
    folder = spool.job_folder(Path(args.spool), os.environ["ROTA_JOB_ID"])
    folder.mkdir(parents=True, exist_ok=True)
    ended = spool.read_final(folder)
    if ended is not None:  # a retry of a run that ended on its own: end the same way
        print(f"rota-slurm: the job already ended {ended[0]} (exit {ended[1]})", file=sys.stderr)
        return ended[1]
    restarts_file = folder / "restarts"
    restarts = int(restarts_file.read_text()) + 1 if restarts_file.exists() else 0
    restarts_file.write_text(str(restarts))
    (folder / "requeue").unlink(missing_ok=True)
    env = {**os.environ, **slurm_environment(args, restarts)}
    run = start(args, folder, env)
    stop = {"term": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(term=True))  # Rota's cancel or a lost placement
    while (code := run.process.poll()) is None:
        if stop["term"]:
            terminate(run)
        tick(run)
        time.sleep(POLL_S)
    relay.end(env)
    if stop["term"]:  # cancelled, or stopped by the agent at the job file's time_limit
        if run.limit_s is not None and time.monotonic() - run.started >= run.limit_s - LIMIT_SLACK_S:
            (folder / "final").write_text(f"TIMEOUT {TIMEOUT_EXIT}\n")
        return 128 + signal.SIGTERM
    return finish(run, code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
