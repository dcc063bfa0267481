"""Steps over several nodes. A multi-node sbatch job is a Rota gang: on each node the agent
starts the launcher once per GPU slot; local rank 0 of node rank 0 runs the batch script,
local rank 0 of every other node serves its steps (serve), the other slots exit at once.
`srun` on node 0 writes a request in the job's shared folder; each node's server starts the
step's tasks there (SLURM_PROCID = node * tasks per node + local) and writes their status."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rota.slurm import spool

POLL_S = 0.2
# What stays each node's own when a step's environment travels from node 0.
NODE_OWN = ("SLURM_NODEID", "SLURMD_NODENAME", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES",
            "ROTA_GPUS", "ROTA_NODE", "ROTA_CONTROL_DIR", "ROTA_PROGRESS_FILE", "ROTA_ITERATIONS_FILE",
            "NODE_RANK", "GROUP_RANK", "RANK", "LOCAL_RANK", "HOSTNAME")


def _folder(env: dict[str, str]) -> Path:
    return spool.job_folder(spool.root(env), env["ROTA_SLURM_JOB"])


def ask_other_nodes(options: dict[str, str], command: Sequence[str], env: dict[str, str]) -> Path | None:
    """Node 0's srun: the request the other nodes' servers run (None on a one-node job)."""
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    if nodes == 1:
        return None
    requests = _folder(env) / "step-requests"
    requests.mkdir(parents=True, exist_ok=True)
    epoch = env.get("ROTA_EPOCH", "0")
    step = len(list(requests.glob(f"{epoch}-*.json")))
    env["SLURM_STEP_ID"] = str(step)
    body = {"options": options, "command": list(command), "env": {k: v for k, v in env.items() if k not in NODE_OWN}}
    partial = requests / f".{epoch}-{step}.json"
    partial.write_text(json.dumps(body))
    final = requests / f"{epoch}-{step}.json"
    partial.rename(final)
    return final


def wait_other_nodes(request: Path | None, env: dict[str, str]) -> list[int]:
    """The other nodes' statuses for the step, once each has written its own."""
    if request is None:
        return []
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    results = [request.with_suffix(f".node{n}") for n in range(1, nodes)]
    while not all(r.exists() for r in results):
        time.sleep(POLL_S)
    return [int(r.read_text() or 1) for r in results]


def serve(env: dict[str, str]) -> int:
    """Another node's launcher: runs each step node 0 asks for, until the batch script ends
    (node 0 writes `ended-EPOCH`) or Rota stops the gang (SIGTERM)."""
    from rota.slurm import steps

    folder = _folder(env)
    epoch, node = env.get("ROTA_EPOCH", "0"), env.get("SLURM_NODEID", "0")
    requests = folder / "step-requests"
    running: dict[Path, list[Any]] = {}
    stopped = {"term": False}
    signal.signal(signal.SIGTERM, lambda *_: stopped.update(term=True))
    while not stopped["term"] and not (folder / f"ended-{epoch}").exists():
        for request in sorted(requests.glob(f"{epoch}-*.json")) if requests.is_dir() else []:
            if request not in running:
                body = json.loads(request.read_text())
                task_env = {**body["env"], **{k: v for k, v in env.items() if k in NODE_OWN}}
                running[request] = steps.launch(body["options"], body["command"], task_env)
        for request, processes in running.items():
            result = request.with_suffix(f".node{node}")
            if not result.exists() and all(p.poll() is not None for p in processes):
                codes = [p.returncode if p.returncode >= 0 else 128 - p.returncode for p in processes]
                result.write_text(str(max(codes, default=0)))
        time.sleep(POLL_S)
    for processes in running.values():
        for process in processes:
            if process.poll() is None:
                process.terminate()
    return 128 + signal.SIGTERM if stopped["term"] else 0


def end(env: dict[str, str]) -> None:
    """Node 0's launcher after the batch script: the other nodes' servers may stop."""
    if int(env.get("SLURM_JOB_NUM_NODES", "1")) > 1:
        (_folder(env) / f"ended-{env.get('ROTA_EPOCH', '0')}").write_text("")


def role(environ: dict[str, str] | None = None) -> str:
    """"batch" (run the script), "serve" (another node's steps) or "idle" (another GPU slot of a gang)."""
    env = os.environ if environ is None else environ
    if not env.get("ROTA_GANG_NODES"):
        return "batch"
    if env.get("LOCAL_RANK", "0") != "0":
        return "idle"
    return "batch" if env.get("NODE_RANK", "0") == "0" else "serve"
