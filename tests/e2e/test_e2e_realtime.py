"""A realtime app across nodes on a real local cluster (3 nodes x 2 slots): it grows past one
node (one process per replica), loses the node of its home agent, serves on from the other
without a restart, and grows again on the third node."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, process_environments, wait_until

# One replica: reports a cumulative `served` five times a second (stdlib and rota.runtime only).
REPLICA = """\
import signal, sys, time
from rota.runtime import replica, report
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
assert replica() is not None, "one process per replica"
served = 0
while True:
    served += 1
    report(served=served, replicas=1)
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "realtime", nodes=3, gpus_per_node=2)


def held(cluster: RunningCluster, job_id: str) -> dict[str, list[int]]:
    """Node -> the GPUs the app holds there, as `rota nodes` shows them (alive nodes only)."""
    with cluster.client() as client:
        nodes = client.nodes()
    return {n.name: [g.index for g in n.gpus if g.job_id == job_id] for n in nodes
            if n.health == "ALIVE" and any(g.job_id == job_id for g in n.gpus)}


def replica_processes(job_id: str) -> dict[str, tuple[str, str]]:
    """pid -> (node, GPU) of each live replica process of the app."""
    return {pid: (env["ROTA_NODE"], env["ROTA_REPLICA_GPU"]) for pid, env in process_environments().items()
            if env.get("ROTA_JOB_ID") == job_id and "ROTA_REPLICA_GPU" in env}


def test_an_app_grows_past_a_node_survives_losing_one_and_grows_again(three_nodes: RunningCluster, tmp_path: Path) -> None:
    cluster = three_nodes
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    app = cluster.submit_job("serve-wide", ["python", str(script)], kind="realtime", gpus=0, demand=[4], max_swap=0)
    # 1. Four replicas on two nodes, one process each, on its own GPU.
    spread = wait_until(lambda: (h := held(cluster, app)) and sum(map(len, h.values())) == 4 and len(h) == 2 and h,
                   60, "four replicas on two nodes")
    procs = wait_until(lambda: (p := replica_processes(app)) and len(p) == 4 and p, 30, "four replica processes")
    assert sorted(procs.values()) == sorted((n, str(g)) for n, gpus in spread.items() for g in gpus)
    job = cluster.wait_job(app, ("RUNNING",), timeout_s=30)
    home = job.node
    assert home in spread
    # The SDK and the CLI show every node's replicas, the home node first.
    assert job.replicas == {n: sorted(g) for n, g in spread.items()} and next(iter(job.replicas)) == home, job.replicas
    listed = next(j for j in cluster.cli_json("jobs") if j["id"] == app)
    assert listed["replicas"] == job.replicas
    assert all(n in cluster.cli("jobs").stdout for n in spread)
    # 2. The home node's agent dies: the app keeps its replicas on the other node, untouched.
    survivor = next(n for n in spread if n != home)
    kept = {pid for pid, (n, _g) in procs.items() if n == survivor}
    os.kill(cluster.info["pids"][home], signal.SIGKILL)
    # 3. It grows again on the third node, back to four, never having left RUNNING.
    again = wait_until(lambda: (h := held(cluster, app)) and home not in h and sum(map(len, h.values())) == 4 and h,
                  60, "four replicas again, on the live nodes")
    assert survivor in again and len(again) == 2, again
    job = cluster.wait_job(app, ("RUNNING",), timeout_s=10)
    assert job.node == survivor and not [h for h in job.history if h.to_state == "LOST"], job.history
    assert f"node {home} missed heartbeats" in job.reason and "replicas there were lost" in job.reason, job.reason
    live = wait_until(lambda: (p := replica_processes(app)) and len(p) == 4 and p, 30, "four replica processes again")
    assert kept <= set(live), "the survivor's replicas were restarted"
    assert home not in {n for n, _g in live.values()}  # the dead node's replicas were fenced
    served = int(job.progress.get("served", 0))
    wait_until(lambda: int(cluster.wait_job(app, ("RUNNING",)).progress.get("served", 0)) > served, 20, "serving on")
    cluster.cli("cancel", app)
    cluster.wait_job(app, ("CANCELLED",), timeout_s=30)
    wait_until(lambda: not replica_processes(app), 30, "the replicas to stop")
