"""A job larger than a node on a real local cluster: a gloo DDP gang of 2 nodes x 2 slots.

The gang runs one rank group per node with torchrun's variables; its losses equal a
single-process reference's. Killing the agent of its rank-0 node mid-run stops the whole
gang (the other node's ranks too), and it restarts on two live nodes and runs to the end.
A gang pauses as one (every rank of both nodes copies its state, then all exit), holds no
GPU while paused, resumes from one image on whichever two nodes the plan gives it, and
is migrated the same way; its losses still equal the reference's.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import REPO, RunningCluster, own_cluster, process_environments, wait_until

STEPS = 40


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "gang", nodes=3, gpus_per_node=2)


def _rank_envs(job_id: str) -> dict[str, dict[str, str]]:
    """pid -> the rendezvous variables of each live rank process of the job."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "ROTA_NODE", "ROTA_EPOCH")
    return {pid: {k: env.get(k, "") for k in keys} for pid, env in process_environments().items()
            if env.get("ROTA_JOB_ID") == job_id and "LOCAL_RANK" in env}


def _last_run(path: Path) -> list[float]:
    """The losses of the last attempt (each attempt writes from step 1 again)."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.split()[0] == "1"]
    return [float(line.split()[1]) for line in lines[starts[-1]:]]


def _reference(tmp_path: Path, args: list[str]) -> list[float]:
    reference = tmp_path / "reference.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    subprocess.run([sys.executable, "examples/train_ddp.py", *args, "--ranks", "4", "--single-process",
                    "--losses", str(reference)], cwd=REPO, env=env, check=True, timeout=300)
    return [float(line.split()[1]) for line in reference.read_text().splitlines()]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_ddp_gang_pauses_as_one_resumes_and_migrates_with_the_reference_losses(
    three_nodes: RunningCluster, tmp_path: Path,
) -> None:
    cluster = three_nodes
    losses = tmp_path / "losses.txt"
    args = ["--steps", str(STEPS), "--seed", "11", "--report-every", "5", "--batch-size", "32"]
    want = _reference(tmp_path, args)
    job_id = cluster.submit_job(
        "ddp-gang-pause", ["python", "examples/train_ddp.py", *args, "--losses", str(losses), "--step-delay", "0.2"],
        gpus=0, nodes=2, gpus_per_node=2, restart="never",
    )
    first = cluster.wait_job(job_id, ("RUNNING",), timeout_s=120)
    wait_until(lambda: _lines(losses) >= 5, 120, "five steps")
    # 1. Paused: all four ranks copied their state and exited; no GPU of either node is held.
    paused = cluster.cli_json("pause", job_id, "--timeout", "20")
    assert paused["ranks"] == 4 and paused["step"] >= 5, paused
    job = cluster.wait_job(job_id, ("PAUSED",), timeout_s=20)
    assert job.nodes == [] and job.gpus == [] and "paused at step" in job.reason, job
    holders = {g["job"] for n in cluster.cli_json("nodes") for g in n["gpus"]}
    assert job_id not in holders
    wait_until(lambda: not _rank_envs(job_id), 20, "the paused ranks to exit")
    # 2. Resumed from the one image, on two nodes the plan chose; it carries on from its step.
    cluster.cli_json("resume", job_id, "--wait", "60")
    resumed = cluster.wait_job(job_id, ("RUNNING",), timeout_s=60)
    assert len(resumed.nodes) == 2 and resumed.epoch != first.epoch
    wait_until(lambda: _lines(losses) >= paused["step"] + 5, 120, "five steps after the resume")
    # 3. Migrated: pause, write, resume in one call.
    moved = cluster.cli_json("move", job_id, "--wait", "60")
    assert moved["step"] > paused["step"], moved
    done = cluster.wait_job(job_id, timeout_s=300)
    assert done.state == "SUCCEEDED", (done.state, done.reason, done.error)
    # Each attempt continued from its image: one loss per step, none repeated or skipped.
    got = [float(line.split()[1]) for line in losses.read_text().splitlines()]
    assert [int(line.split()[0]) for line in losses.read_text().splitlines()] == list(range(1, STEPS + 1))
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(got, want, strict=True)), list(zip(got, want, strict=True))[:5]
    images = cluster.cli_json("checkpoints", job_id)["images"]
    assert [i["step"] for i in images] == [paused["step"], moved["step"]]
    assert all(i["state"] == "complete" and i["ranks"] == 4 for i in images), images
    # The replicated model and optimizer are stored once across both nodes' ranks.
    assert images[0]["stored_bytes"] < 0.7 * images[0]["logical_bytes"], images[0]


def test_a_ddp_gang_on_two_nodes_matches_the_reference_and_survives_losing_a_node(
    three_nodes: RunningCluster, tmp_path: Path,
) -> None:
    cluster = three_nodes
    losses = tmp_path / "losses.txt"
    args = ["--steps", str(STEPS), "--seed", "7", "--report-every", "5", "--batch-size", "32"]
    reference = tmp_path / "reference.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    subprocess.run([sys.executable, "examples/train_ddp.py", *args, "--ranks", "4", "--single-process",
                    "--losses", str(reference)], cwd=REPO, env=env, check=True, timeout=300)
    job_id = cluster.submit_job(
        "ddp-gang", ["python", "examples/train_ddp.py", *args, "--losses", str(losses), "--step-delay", "0.15"],
        gpus=0, nodes=2, gpus_per_node=2, restart="on-failure", max_retries=2,
    )
    # 1. One epoch, two nodes, four ranks with torchrun's variables.
    running = cluster.wait_job(job_id, ("RUNNING",), timeout_s=120)
    assert len(running.nodes) == 2 and running.node == running.nodes[0], running
    def four_ranks() -> dict[str, dict[str, str]] | None:
        found = _rank_envs(job_id)
        return found if len(found) == 4 else None

    ranks = wait_until(four_ranks, 60, "four rank processes")
    assert sorted(int(e["RANK"]) for e in ranks.values()) == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for e in ranks.values()} == {"4"}
    assert {(e["ROTA_NODE"], e["NODE_RANK"]) for e in ranks.values()} == {(running.nodes[0], "0"), (running.nodes[1], "1")}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"], e["ROTA_EPOCH"]) for e in ranks.values()}) == 1
    # 2. Mid-run, the agent of node rank 0 dies: the whole gang stops, on both nodes.
    wait_until(lambda: losses.exists() and len(losses.read_text().splitlines()) >= 5, 120, "five steps")
    dead = running.nodes[0]
    os.kill(cluster.info["pids"][dead], signal.SIGKILL)
    again = cluster.wait_job(job_id, ("RUNNING",), timeout_s=90, reason="started as a gang")
    while again.epoch == running.epoch:
        again = cluster.wait_job(job_id, ("RUNNING",), timeout_s=60, reason="started as a gang")
    lost = [h for h in again.history if h.to_state == "LOST"]
    assert lost and dead in lost[0].reason and "gang" in lost[0].reason, [h.reason for h in again.history]
    assert dead not in again.nodes and len(again.nodes) == 2 and again.attempts == 2
    # The old epoch's ranks are gone everywhere (the survivor's stopped by its agent, the
    # dead node's fenced by the launcher once the agent's lease lapsed).
    wait_until(lambda: all(e["ROTA_EPOCH"] == str(again.epoch) for e in _rank_envs(job_id).values()), 60,
          "the old attempt's ranks to stop")
    # 3. The restarted gang runs to the end; its losses equal the reference's.
    done = cluster.wait_job(job_id, timeout_s=300)
    assert done.state == "SUCCEEDED", (done.state, done.reason, done.error)
    got, want = _last_run(losses), [float(line.split()[1]) for line in reference.read_text().splitlines()]
    assert len(got) == len(want) == STEPS
    # Equal up to float32 rounding: DDP sums the ranks' gradients in gloo's order.
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(got, want, strict=True)), list(zip(got, want, strict=True))[:5]


def test_a_gang_too_large_waits_with_its_reason_and_an_unknown_type_is_refused(
    three_nodes: RunningCluster, tmp_path: Path,
) -> None:
    cluster = three_nodes
    big = tmp_path / "big.yaml"
    big.write_text("name: big\ntenant: demo\nnodes: 4\ngpus_per_node: 2\ncommand: [python, examples/sleep_job.py]\n")
    job_id = cluster.cli_json("submit", str(big))["id"]
    waiting = cluster.wait_job(job_id, ("PENDING",), reason="needs 4 nodes", timeout_s=60)
    # (2 or 3 live nodes: the test above leaves one agent killed.)
    assert re.search(r"needs 4 nodes of 2 GPUs; the live cluster has [23] nodes", waiting.reason), waiting.reason
    assert "needs 4 nodes of 2 GPUs" in cluster.cli("explain", job_id).stdout
    cluster.cli("cancel", job_id)
    typed = tmp_path / "typed.yaml"
    typed.write_text("name: typed\ntenant: demo\ngpu_type: h100\ncommand: [python, examples/sleep_job.py]\n")
    # This cluster's virtual slots declare no type: nothing to check a type against at
    # submit (a node of that type may join), so it is held with the reason.
    held = cluster.wait_job(cluster.cli_json("submit", str(typed))["id"], ("PENDING",), reason="type h100", timeout_s=60)
    assert "no live node has them" in held.reason, held.reason
    cluster.cli("cancel", held.id)


# A rank group that fails at once on node rank 1 (first attempt only) while node rank 0's
# runs on, and takes 2.5 s to stop on SIGTERM: the next attempt runs a few seconds.
FAILING_GROUP = """
import os, signal, sys, time
marker, epoch = sys.argv[1], os.environ["ROTA_EPOCH"]
first = not os.path.exists(marker) or open(marker).read() == epoch
if os.environ["NODE_RANK"] == "1" and first:
    open(marker, "w").write(epoch)
    time.sleep(1.0)
    sys.exit(3)
def slow_stop(*_):
    time.sleep(2.5)
    sys.exit(143)
signal.signal(signal.SIGTERM, slow_stop)
time.sleep(120 if first else 3)
"""


def test_a_failed_rank_group_stops_the_other_nodes_ranks_before_the_gang_runs_again(
    three_nodes: RunningCluster, tmp_path: Path,
) -> None:
    cluster = three_nodes
    marker = tmp_path / "failed-epoch"
    job_id = cluster.submit_job("gang-fails", ["python", "-c", FAILING_GROUP, str(marker)],
                                gpus=0, nodes=2, gpus_per_node=1, restart="on-failure", max_retries=1)
    first = cluster.wait_job(job_id, ("RUNNING",), timeout_s=120)
    # The process table, sampled from the start until the next attempt has run: which
    # epochs' ranks were alive together, and on which nodes.
    samples: list[set[tuple[str, str]]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        alive = {(e["ROTA_EPOCH"], e["ROTA_NODE"]) for e in _rank_envs(job_id).values()}
        samples.append(alive)
        if any(epoch != str(first.epoch) for epoch, _ in alive) and len(alive) == 2:
            break  # the next attempt's two groups run
        time.sleep(0.05)
    old = str(first.epoch)
    seen_old_alone = [s for s in samples if s and all(epoch == old for epoch, _ in s)]
    assert any(len(s) == 2 for s in seen_old_alone), "the first attempt never ran on both nodes"
    # Node rank 1's group failed; node rank 0's ran on, then took 2.5 s to stop: no sample
    # ever shows a rank of the old epoch beside one of the next.
    mixed = [s for s in samples if {epoch for epoch, _ in s} - {old} and old in {epoch for epoch, _ in s}]
    assert not mixed, f"old ranks ran beside the next attempt's: {mixed[:3]}"
    assert any({epoch for epoch, _ in s} - {old} for s in samples), "the gang never ran again"
    done = cluster.wait_job(job_id, timeout_s=120)
    assert done.state == "SUCCEEDED", (done.state, done.reason, done.error)
    failed = [h.reason for h in done.history if "rank group on" in h.reason]
    assert failed and "the whole gang stopped" in failed[0] and "stop before it is placed again" in failed[0], failed
