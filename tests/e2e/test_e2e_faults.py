"""Faults on a real local cluster: a node dies, the control plane restarts mid-run."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import REPO, RunningCluster, job_processes, own_cluster, processes_of, wait_until
from sqlalchemy import create_engine, text

from rota.bench.fault_harness import Watch, alive_pids
from rota.bench.faults import rank_pids
from rota.client import job_spec_from_mapping, load_job_file


def _sleep_spec(seconds: int, *, restart: str = "on-failure") -> Any:
    data = {"tenant": "demo", **load_job_file(REPO / "examples" / "sleep.yaml")}
    data["command"] = ["python", "examples/sleep_job.py", "--seconds", str(seconds)]
    data["restart"] = restart
    return job_spec_from_mapping(data, base_dir=REPO)


def _overlapping_claims(database_url: str) -> list[Any]:
    """Placements whose GPU use overlapped in time on the same node (from Postgres)."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        rows = conn.execute(text(
            """SELECT a.job_id, b.job_id, a.node FROM placements a JOIN placements b
               ON a.node = b.node AND a.id < b.id AND a.gpu_indices && b.gpu_indices
               AND b.created_at < COALESCE(a.released_at, now())
               AND a.created_at < COALESCE(b.released_at, now())"""
        )).all()
    engine.dispose()
    return list(rows)


@pytest.fixture
def fresh(cluster: RunningCluster) -> Iterator[RunningCluster]:
    yield cluster


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "faults-gang", nodes=2, gpus_per_node=1)


def test_killing_one_node_of_a_gang_stops_the_surviving_nodes_ranks_by_pid(two_nodes: RunningCluster) -> None:
    cluster = two_nodes
    job_id = cluster.submit_job("gang-kill", ["python", "examples/sleep_job.py", "--seconds", "300"],
                                gpus=0, nodes=2, gpus_per_node=1, restart="on-failure", max_retries=2)
    first = cluster.wait_job(job_id, ("RUNNING",), timeout_s=120)
    ranks = wait_until(lambda: rank_pids(cluster.home, job_id, first.epoch, set(first.nodes)), 60, "a rank on each node")
    dead = first.nodes[1]
    survivors = {pid for node, pids in ranks.items() if node != dead for pid in pids}
    assert survivors and alive_pids(survivors) == survivors
    os.kill(cluster.info["pids"][dead], signal.SIGKILL)
    # The surviving node's rank processes (by pid) exit, stopped by its own agent, long
    # before their 300 s and while the killed node stays dead (the gang cannot run again
    # without it); the killed node's rank is fenced too.
    wait_until(lambda: not alive_pids(survivors), 60, f"the surviving node's ranks {sorted(survivors)} to exit")
    wait_until(lambda: not alive_pids(ranks[dead]), 60, f"the killed node's ranks {sorted(ranks[dead])} to exit")
    nodes = {n["name"]: n["health"] for n in cluster.cli_json("nodes")}
    assert nodes[dead] != "ALIVE", nodes
    cluster.wait_job(job_id, ("PENDING", "LOST"), timeout_s=30)  # waiting for a second live node
    cluster.cli("cancel", job_id)


def test_killing_an_agent_makes_its_node_dead_and_its_job_lost_then_requeued(cluster: RunningCluster) -> None:
    with cluster.client() as client:
        job = client.submit(spec=_sleep_spec(60))
    running = cluster.wait_job(job.id, ("RUNNING",))
    first_node = running.node
    agent_pid = cluster.info["pids"][first_node]
    os.kill(agent_pid, signal.SIGKILL)
    # The node is dead after the heartbeat timeout, the job LOST, then requeued (on-failure).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = {n["name"]: n for n in cluster.cli_json("nodes")}
        if nodes[first_node]["health"] == "DEAD":
            break
        time.sleep(0.3)
    assert nodes[first_node]["health"] == "DEAD"
    moved = cluster.wait_job(job.id, ("RUNNING",), timeout_s=30)
    assert moved.node != first_node and moved.attempts == 2
    states = [h.to_state for h in moved.history]
    assert "LOST" in states and states.index("LOST") < len(states) - 1
    lost = next(h for h in moved.history if h.to_state == "LOST")
    assert "missed heartbeats" in lost.reason
    # The copy on the dead node fences itself once the agent's lease lapses: one copy runs.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        nodes_running = {env["ROTA_NODE"] for env in job_processes().values() if env.get("ROTA_JOB_ID") == job.id}
        if nodes_running == {moved.node}:
            break
        time.sleep(0.2)
    assert nodes_running == {moved.node}
    cluster.cli("cancel", job.id)


def test_restarting_api_and_allocator_mid_run_loses_no_job_and_double_books_no_gpu(cluster: RunningCluster) -> None:
    with cluster.client() as client:
        ids = [client.submit(spec=_sleep_spec(4, restart="never")).id for _ in range(5)]
    with Watch(cluster.home) as watch:
        cluster.wait_job(ids[0], ("RUNNING",))
        old = cluster.info["pids"]
        os.kill(old["api"], signal.SIGKILL)
        os.kill(old["allocator"], signal.SIGKILL)
        # The supervisor restarts them (as a Deployment would); every job still finishes.
        finished = [cluster.wait_job(i, timeout_s=120) for i in ids]
    assert cluster.info["pids"]["api"] != old["api"]
    assert [j.state for j in finished] == ["SUCCEEDED"] * len(ids), [(j.id, j.state, j.reason) for j in finished]
    assert watch.seen_jobs >= set(ids)  # it watched this cluster's jobs
    assert watch.double_booked == set() and watch.two_copies == set()
    assert _overlapping_claims(cluster.database_url) == []
    assert all(processes_of(i) == [] for i in ids)
