"""Trials in pipeline bubbles on a real local cluster (1 node x 2 GPUs), through the CLI: a
`kind: trial` job takes a free GPU when there is one; when a real 2-stage GPipe job holds
every GPU and reports its bubbles, the next trial runs as its guest on its GPUs, at idle
priority, stopped by the stage outside its bubbles; once the pipeline ends, the trial takes
its GPUs over and runs on to success without a restart. A guest paused in the bubbles
resumes from its state: its losses equal an uninterrupted run's."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, processes_of, reference, wait_lines, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "guests", nodes=1, gpus_per_node=2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_file(folder: Path, name: str, kind: str, gpus: int, command: list[str]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"name": name, "tenant": "demo", "kind": kind, "gpus": gpus, "command": command,
                                "duration": "1m", "priority": 5 if kind == "training" else 1}))
    return path


def trial(folder: Path, name: str, steps: int, *extra: str) -> Path:
    return job_file(folder, name, "trial", 1, ["python", "examples/trial_fused.py", "--steps", str(steps), *extra])


def pipeline(cluster: RunningCluster, folder: Path, steps: int) -> str:
    """A 2-stage GPipe job on both GPUs, once it has reported its bubbles."""
    host: str = cluster.cli_json("submit", str(job_file(folder, "pipe", "training", 2, [
        "python", "examples/pipeline_bubbles.py", "--steps", str(steps), "--port", str(free_port())])))["id"]
    wait_until(lambda: "bubble_s" in cluster.cli_json("job", host)["progress"], 90, "the pipeline's bubbles")
    return host


def proc_states(job_id: str) -> set[str]:
    out = set()
    for pid in processes_of(job_id):
        try:
            out.add(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return out


def test_a_trial_takes_a_free_gpu_else_a_pipelines_bubbles_then_its_gpus(cluster: RunningCluster, tmp_path: Path) -> None:
    # 1. GPUs are free: a trial is placed on one, as any job would be.
    alone = cluster.cli_json("submit", str(trial(tmp_path, "alone", 30)))["id"]
    done = cluster.wait_job(alone, timeout_s=90)
    assert done.state == "SUCCEEDED" and done.guest_of == ""
    # 2. A pipeline job holds both GPUs and reports its bubbles.
    host = pipeline(cluster, tmp_path, 90)
    shown = cluster.cli_json("job", host)["progress"]
    assert 0 < shown["bubble_s"] < shown["step_s"]
    # 3. No GPU is free: the next trial runs as the pipeline's guest on its stage-0 GPU.
    guest = cluster.cli_json("submit", str(trial(tmp_path, "guest", 800)))["id"]
    placed = cluster.wait_job(guest, states=("RUNNING",), timeout_s=60)
    assert (placed.guest_of, placed.gpus) == (host, [0])
    assert any("guest in the pipeline bubbles of " + host in h.reason for h in placed.history)
    assert f"in {host}'s bubbles" in cluster.cli("job", guest).stdout
    assert cluster.cli_json("job", host)["guests"] == [guest]  # the host names its guests
    assert f"guests:   {guest} (trials in its bubbles)" in cluster.cli("job", host).stdout
    # It runs at idle priority, and the stage stops it outside its bubbles and lets it run inside.
    pids = wait_until(lambda: processes_of(guest), 30, "the guest's processes")
    assert all(os.sched_getscheduler(int(pid)) == os.SCHED_IDLE for pid in pids)
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while not {"T", "R"} <= seen and time.monotonic() < deadline and cluster.cli_json("job", host)["state"] == "RUNNING":
        seen |= proc_states(guest)
        time.sleep(0.003)
    assert "T" in seen, f"the guest was never seen stopped: {seen}"
    assert {"R", "S"} & seen, f"the guest was never seen running: {seen}"
    # 4. The pipeline ends: the trial takes its GPUs over and runs on, under the same epoch.
    assert cluster.wait_job(host, timeout_s=120).state == "SUCCEEDED"
    with cluster.client() as client:
        taken = wait_until(lambda: (j := client.get_job(guest)).guest_of == "" and j, 30, "the takeover")
    assert taken.state == "RUNNING" and taken.epoch == placed.epoch and taken.gpus == [0]
    finished = cluster.wait_job(guest, timeout_s=180)
    assert finished.state == "SUCCEEDED" and finished.attempts == 1, finished.error
    assert finished.progress["step"] == 800


def test_a_guest_paused_in_the_bubbles_resumes_from_its_state(cluster: RunningCluster, tmp_path: Path) -> None:
    command = ["python", "examples/trial_fused.py", "--steps", "150"]
    want = reference(command, tmp_path / "ref.txt")  # first: beside the jobs it would crowd the two cores
    host = pipeline(cluster, tmp_path, 150)
    losses = tmp_path / "losses.txt"
    guest = cluster.cli_json("submit", str(trial(tmp_path, "paused", 150, "--losses", str(losses))))["id"]
    assert cluster.wait_job(guest, states=("RUNNING",), timeout_s=60).guest_of == host
    wait_lines(losses, 10)
    paused = cluster.cli_json("pause", guest, "--timeout", "30")
    assert paused["step"] >= 10
    job = cluster.wait_job(guest, ("PAUSED",), timeout_s=20)
    assert (job.node, job.gpus, job.guest_of) == ("", [], "")
    resumed = cluster.cli_json("resume", guest, "--wait", "60")
    assert resumed["step"] == paused["step"]
    done = cluster.wait_job(guest, timeout_s=240)
    assert done.state == "SUCCEEDED", done.error
    assert losses.read_text().splitlines() == want
    assert cluster.wait_job(host, timeout_s=120).state == "SUCCEEDED"
