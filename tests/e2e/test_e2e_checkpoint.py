"""Pause, resume and migrate on a real local cluster (two nodes of one GPU slot each).

A paused job is PAUSED and holds no GPU; resumed on the same node and then on the other
one it continues from its image's step, and its losses are bit-identical to an
uninterrupted run's with the same seed: for the example LM, and for a two-rank gloo job
paused, resumed and then migrated.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import REPO, RunningCluster, processes_of, reference, start_cluster, wait_lines, wait_until

from rota.client import FailedPreconditionError

pytestmark = pytest.mark.e2e

LM = ["python", "examples/train_lm.py", "--steps", "60", "--seed", "5", "--report-every", "5"]
DDP = ["python", "examples/train_ddp.py", "--steps", "50", "--seed", "3", "--ranks", "2", "--report-every", "5"]
DELAY = ["--step-delay", "0.2"]  # slow enough to pause mid-run on a busy machine, short enough for CI


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    url = databases.create()
    home = tmp_path_factory.mktemp("ckpt") / "home"
    # Chunks land in the cluster's own store; tmpfs staging is per-node under it.
    running = start_cluster(home, url, redis_url, nodes=2, gpus_per_node=1,
                            extra_env={"ROTA_STAGING_ROOT": str(home.parent / "staging")})
    try:
        running.cli("tenants", "add", "demo")
        yield running
    finally:
        running.stop()
        databases.drop(url)


def submit(cluster: RunningCluster, name: str, command: list[str], **fields: Any) -> str:
    """This module's jobs are preemptible unless a test says otherwise."""
    return cluster.submit_job(name, command, **{"preemptible": True, **fields})


def gpu_holders(cluster: RunningCluster) -> dict[str, str | None]:
    return {n["name"]: n["gpus"][0]["job"] for n in cluster.cli_json("nodes")}


def pause(cluster: RunningCluster, job_id: str) -> dict[str, Any]:
    paused: dict[str, Any] = cluster.cli_json("pause", job_id, "--timeout", "15")
    job = cluster.wait_job(job_id, ("PAUSED",), timeout_s=10)
    assert job.node == "" and job.gpus == [], job
    assert job_id not in gpu_holders(cluster).values()
    deadline = time.monotonic() + 10
    while processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of(job_id) == []
    return paused


def test_a_paused_job_resumes_on_its_node_and_on_another_with_identical_losses(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    # The reference runs first: beside the job, on two busy cores, it would let the job
    # finish before it could be paused.
    want = reference(LM, tmp_path / "ref.txt")
    losses = tmp_path / "lm.txt"
    job_id = submit(cluster, "lm", [*LM, *DELAY, "--losses", str(losses)])
    first = cluster.wait_job(job_id, ("RUNNING",)).node
    filler = submit(cluster, "filler", ["python", "examples/sleep_job.py", "--seconds", "300", "--no-checkpoint"])
    other = cluster.wait_job(filler, ("RUNNING",)).node
    assert {first, other} == {"node-1", "node-2"}

    # A job that never registered state cannot be paused: a clear reason, and it runs on.
    with cluster.client() as client, pytest.raises(FailedPreconditionError, match="rota.runtime"):
        client.pause(filler, timeout=timedelta(seconds=2))
    assert cluster.wait_job(filler, ("RUNNING",)).node == other

    wait_lines(losses, 8)
    paused = pause(cluster, job_id)
    assert paused["step"] >= 8 and paused["pause_seconds"] > 0
    resumed = cluster.cli_json("resume", job_id, "--wait", "60")
    assert resumed["node"] == first and resumed["step"] == paused["step"]  # the only free GPU

    wait_lines(losses, paused["step"] + 8)
    again = pause(cluster, job_id)
    assert again["step"] > paused["step"]
    blocker = submit(cluster, "blocker", ["python", "examples/sleep_job.py", "--seconds", "300"])
    assert cluster.wait_job(blocker, ("RUNNING",)).node == first
    cluster.cli("cancel", filler)
    moved = cluster.cli_json("resume", job_id, "--wait", "60")
    assert moved["node"] == other and moved["step"] == again["step"]

    done = cluster.wait_job(job_id, timeout_s=180)
    cluster.cli("cancel", blocker)
    assert done.state == "SUCCEEDED", done.reason
    assert losses.read_text().splitlines() == want
    states = [h.to_state for h in done.history]
    assert states.count("PAUSED") == 2 and states[-1] == "SUCCEEDED"
    images = cluster.cli_json("checkpoints", job_id)
    assert [i["step"] for i in images["images"] if i["state"] == "complete"] == [paused["step"], again["step"]]


def test_a_two_rank_gloo_job_pauses_and_resumes_with_identical_losses_and_dedup(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    want = reference(DDP, tmp_path / "ref.txt")
    losses = tmp_path / "ddp.txt"
    job_id = submit(cluster, "ddp", [*DDP, *DELAY, "--losses", str(losses)])
    cluster.wait_job(job_id, ("RUNNING",))
    wait_lines(losses, 6)
    paused = pause(cluster, job_id)
    assert paused["ranks"] == 2
    resumed = cluster.cli_json("resume", job_id, "--wait", "60")
    wait_lines(losses, paused["step"] + 6)
    moved = cluster.cli_json("move", job_id, "--wait", "60")  # pause, write, resume: one call
    assert moved["from_node"] == resumed["node"] and moved["step"] > paused["step"] and moved["node"]
    done = cluster.wait_job(job_id, timeout_s=180)
    assert done.state == "SUCCEEDED", done.reason
    assert losses.read_text().splitlines() == want

    images = cluster.cli_json("checkpoints", job_id)
    assert [i["step"] for i in images["images"]] == [paused["step"], moved["step"]]
    image = images["images"][0]
    assert image["state"] == "complete" and image["ranks"] == 2 and image["step"] == paused["step"]
    # The ranks' model and optimizer are replicas: stored once, so well under twice one rank.
    assert image["stored_bytes"] < 0.7 * image["logical_bytes"]
    assert image["dedup_ratio"] > 1.4
    table = cluster.cli("checkpoints", job_id).stdout
    assert image["id"] in table and "dedup" in table


def test_the_allocator_pauses_a_preemptible_job_for_higher_priority_work_and_resumes_it_without_loss(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    slow = [*LM, "--step-delay", "0.4"]  # long enough to be preempted mid-run
    want = reference(LM, tmp_path / "ref.txt")
    losses = tmp_path / "low.txt"
    low = submit(cluster, "low", [*slow, "--losses", str(losses)], priority=1)
    home = cluster.wait_job(low, ("RUNNING",)).node
    filler = submit(cluster, "filler", ["python", "examples/sleep_job.py", "--seconds", "300"], preemptible=False)
    cluster.wait_job(filler, ("RUNNING",))
    wait_lines(losses, 5)
    cluster.cli("checkpoint", low)  # a measured cost: a job without an image is never preempted

    high = submit(cluster, "high", ["python", "examples/sleep_job.py", "--seconds", "2"], priority=9,
                  preemptible=False)
    paused = cluster.wait_job(low, ("PAUSED", "PENDING"), timeout_s=60)
    assert f"paused for {high}" in " ".join(h.reason for h in paused.history), paused.history
    ran = cluster.wait_job(high)
    assert ran.state == "SUCCEEDED" and placed_on(ran) == home  # on the GPU the pause freed

    done = cluster.wait_job(low, timeout_s=180)
    cluster.cli("cancel", filler)
    assert done.state == "SUCCEEDED", done.reason
    assert losses.read_text().splitlines() == want  # no step lost, none run twice
    assert [h.to_state for h in done.history].count("PAUSED") == 1


def test_a_job_resumed_to_a_busy_node_waits_for_that_node_then_runs_there(cluster: RunningCluster, tmp_path: Path) -> None:
    losses = tmp_path / "lm.txt"
    job_id = submit(cluster, "pinned", [*LM, *DELAY, "--losses", str(losses)])
    first = cluster.wait_job(job_id, ("RUNNING",)).node
    wait_lines(losses, 5)
    pause(cluster, job_id)
    blocker = submit(cluster, "blocker", ["python", "examples/sleep_job.py", "--seconds", "300"], preemptible=False)
    target = cluster.wait_job(blocker, ("RUNNING",)).node  # the busy node; the other one is free
    cluster.cli("resume", job_id, "--to", target)
    deadline = time.monotonic() + 30
    while True:  # the other node is free, yet the job waits for the one it asked for
        job = cluster.wait_job(job_id, ("PENDING",))
        if f"asked to run on {target}" in job.reason:
            break
        assert time.monotonic() < deadline, job.reason
        time.sleep(0.2)
    assert job.node == "" and first in ("node-1", "node-2")
    cluster.cli("cancel", blocker)
    done = cluster.wait_job(job_id, timeout_s=180)
    assert done.state == "SUCCEEDED" and placed_on(done) == target


def placed_on(job: Any) -> str:
    """The node of the job's last placement, from its history ("placed on NODE GPUs ...")."""
    reason = [h.reason for h in job.history if h.to_state == "SCHEDULED"][-1]
    return str(reason.split()[2])


def test_the_sleep_example_pauses_at_once_resumes_and_migrates_from_its_step(cluster: RunningCluster) -> None:
    """examples/sleep.yaml calls itself pausable: it is (it registers with rota.runtime, with
    no torch, and reaches a safe point every 50 ms), and a resumed or migrated copy goes on from the
    step it paused at, not from 0."""
    fields = yaml.safe_load((REPO / "examples" / "sleep.yaml").read_text(encoding="utf-8"))
    command = fields.pop("command")
    assert command[:2] == ["python", "examples/sleep_job.py"] and "--no-checkpoint" not in command
    for key in ("name", "tenant", "kind", "gpus"):
        fields.pop(key, None)
    job_id = submit(cluster, "sleep", [*command[:2], "--seconds", "120", "--interval", "0.2"], **fields)
    home = cluster.wait_job(job_id, ("RUNNING",)).node

    def step() -> int:
        with cluster.client() as client:
            return int(client.get_job(job_id).progress.get("step", -1))

    wait_until(lambda: step() >= 3, 60, "three steps")
    paused = pause(cluster, job_id)  # `rota pause --timeout 15`: it failed at 10 s when the job never registered
    assert paused["step"] >= 3 and paused["ranks"] == 1 and paused["pause_seconds"] > 0, paused

    resumed = cluster.cli_json("resume", job_id, "--wait", "60")
    assert resumed["step"] == paused["step"] and resumed["node"], resumed
    wait_until(lambda: step() >= paused["step"] + 3, 60, "three steps after the resume")
    history = cluster.wait_job(job_id, ("RUNNING",)).history
    assert [h.to_state for h in history].count("PAUSED") == 1

    target = "node-2" if resumed["node"] == "node-1" else "node-1"  # free: this module's tests cancel theirs
    moved = cluster.cli_json("move", job_id, "--to", target, "--wait", "60")  # pause, write, resume: one call
    assert moved["from_node"] == resumed["node"] and moved["step"] > paused["step"], moved
    assert moved["node"] == target, moved
    wait_until(lambda: step() >= moved["step"] + 2, 60, "two steps after the migration")
    # Each launch after an image says where it continued (the log of the latest launch).
    wait_until(lambda: f"resumed at step {moved['step']}" in cluster.cli("logs", job_id).stdout, 30,
               "the migrated copy's log")
    cluster.cli("cancel", job_id)
    assert cluster.wait_job(job_id).state == "CANCELLED"
    assert home in ("node-1", "node-2")
