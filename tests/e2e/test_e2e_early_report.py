"""A launch brings the agent's next heartbeat forward: on a cluster whose agents beat once a
minute, a started job still reads RUNNING within seconds, not at the next periodic beat."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster

pytestmark = pytest.mark.e2e

SLOW_HEARTBEAT_S = 60.0
# Well inside the minute between periodic beats (the first is the agent's registration,
# just before the cluster is up), so only a launch-driven beat can report RUNNING in time.
RUNNING_WITHIN_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "early-report", nodes=1,
                           heartbeat_interval_s=SLOW_HEARTBEAT_S, extra_env={"ROTA_NODE_TIMEOUT": "600"})


def test_a_started_job_reads_running_before_the_next_periodic_heartbeat(cluster: RunningCluster) -> None:
    submitted = cluster.cli_json("submit", "examples/sleep.yaml", token=cluster.demo_token)
    try:
        job = cluster.wait_job(submitted["id"], states=("RUNNING",), timeout_s=RUNNING_WITHIN_S)
        assert job.node and job.gpus
        assert [h["to"] for h in cluster.cli_json("job", job.id)["history"]] == ["SCHEDULED", "RUNNING"]
    finally:
        cluster.cli("cancel", submitted["id"])
