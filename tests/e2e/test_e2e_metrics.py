"""Every service's and agent's /metrics, scraped on a real local cluster (2 nodes x 2 slots).

`rota up` lists the endpoints in cluster.json; each answers in Prometheus's text format
with the named series, and the values agree with what the CLI says: the allocated GPUs
are the running job's, the live capacity is the cluster's, one allocator leads, a refused
submission is counted under its status code.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, wait_until
from prometheus_client.parser import text_string_to_metric_families

Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "metrics", nodes=2, gpus_per_node=2)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200 and reply.headers.get_content_type() == "text/plain"
        text = reply.read().decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _try_scrape(url: str) -> Samples | None:
    try:
        return scrape(url)
    except OSError:  # connection refused: not listening yet
        return None


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for n, got, v in samples if n == name and all(got.get(k) == w for k, w in labels.items()))


def names(samples: Samples) -> set[str]:
    return {n for n, _, _ in samples}


def eventually(read: Callable[[], Any], check: Callable[[Any], bool], what: str, timeout_s: float = 30) -> Any:
    """cluster.wait_until over `read`'s values, naming the last one when it times out."""
    last: list[Any] = [None]

    def holds() -> bool:
        last[0] = read()
        return check(last[0])

    try:
        wait_until(holds, timeout_s, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {last[0]}") from None
    return last[0]


def test_every_process_serves_the_named_series_with_values_that_agree_with_the_cluster(
    two_nodes: RunningCluster, tmp_path: Path,
) -> None:
    cluster = two_nodes
    endpoints: dict[str, str] = cluster.info["metrics"]
    assert {"api", "allocator", "ledger", "forecaster", "checkpoint", "detector", "node-1", "node-2"} <= set(endpoints)
    for process, url in endpoints.items():
        # `rota up` returns once the api serves and the nodes registered; the other
        # services may still be importing on a busy machine: their endpoint comes up soon.
        samples = eventually(lambda u=url: _try_scrape(u), lambda got: got is not None, f"{process}'s /metrics", 60)
        assert total(samples, "rota_component_info") == 1, process
        assert "process_cpu_seconds_total" in names(samples), process

    # Long enough to be scraped while it runs on a busy machine; cancelled at the end.
    job_id = cluster.submit_job("metered", ["python", "examples/sleep_job.py", "--seconds", "120"], gpus=2)
    cluster.wait_job(job_id, ("RUNNING",), timeout_s=60)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntenant: demo\ngpus: 3\ncommand: [python, examples/sleep_job.py]\n")
    assert cluster.cli("submit", str(bad), check=False).returncode != 0

    # 1. The api: jobs by state, each node's GPUs, heartbeats; RPCs by method and code.
    def api() -> Samples:
        return scrape(endpoints["api"])

    running = eventually(api, lambda s: total(s, "rota_jobs", state="RUNNING") == 1, "the running job in rota_jobs")
    held = sum(len(j["gpus"]) for j in cluster.cli_json("jobs") if j["state"] == "RUNNING")
    assert held == 2 and total(running, "rota_node_gpus", state="allocated") == held
    assert total(running, "rota_node_gpus") == 4  # allocated + idle + bad: every GPU once
    ages = [v for n, _, v in running if n == "rota_node_heartbeat_age_seconds"]
    assert len(ages) == 2 and all(0 <= a < 30 for a in ages), ages
    assert total(running, "rota_rpc_server_handled_total", grpc_method="SubmitJob", grpc_code="OK") >= 1
    assert total(running, "rota_rpc_server_handled_total", grpc_method="SubmitJob", grpc_code="INVALID_ARGUMENT") >= 1
    assert total(running, "rota_rpc_server_handling_seconds_count", grpc_method="SubmitJob") >= 2
    assert total(running, "rota_job_queue_wait_seconds_count", kind="training") >= 1
    # The running job's reported progress (sleep_job reports step and total), labelled by job.
    reported = eventually(api, lambda s: total(s, "rota_job_progress", job=job_id, key="total") > 0,
                          "the running job's progress in rota_job_progress")
    assert total(reported, "rota_job_progress", job=job_id, key="total") == 120
    assert {lbl["job"] for n, lbl, _ in reported if n == "rota_job_progress"} == {job_id}
    with urllib.request.urlopen(endpoints["api"], timeout=10) as reply:  # declared, even with none counted yet
        families = {f.name for f in text_string_to_metric_families(reply.read().decode())}
    assert {"rota_postgres_errors", "rota_redis_errors"} <= families, sorted(families)

    # 2. The allocator: one leader, its plans timed by policy and trigger, GPUs held back per node.
    allocator = scrape(endpoints["allocator"])
    assert total(allocator, "rota_allocator_leader") == 1
    assert total(allocator, "rota_plan_seconds_count", policy="fast") >= 1
    assert {lbl["trigger"] for n, lbl, _ in allocator if n == "rota_plan_seconds_count"} <= {"change", "step", "timer",
                                                                                              "leader"}
    assert {lbl["node"] for n, lbl, _ in allocator if n == "rota_plan_gpus_held_back"} == {"node-1", "node-2"}

    # 3. The ledger: the live capacity and each tenant's F.
    ledger = eventually(lambda: scrape(endpoints["ledger"]), lambda s: total(s, "rota_cluster_capacity_gpus") == 4,
                        "the ledger's capacity")
    assert any(lbl.get("tenant") == "demo" for n, lbl, _ in ledger if n == "rota_tenant_fairness_ratio")

    # 4. The agents: a utilisation and memory series per slot; the job's node shows it running.
    job = cluster.wait_job(job_id, ("RUNNING",))
    for node in ("node-1", "node-2"):
        samples = scrape(endpoints[node])
        slots = {lbl["gpu"] for n, lbl, _ in samples if n == "rota_gpu_utilization_ratio"}
        assert slots == {"0", "1"}, (node, slots)
        assert {lbl["gpu"] for n, lbl, _ in samples if n == "rota_gpu_memory_used_bytes"} == {"0", "1"}
        if node == job.node:
            assert total(samples, "rota_agent_jobs_running") == 1
            assert total(samples, "rota_gpu_memory_used_bytes") > 0  # the sleeping job's resident memory

    cluster.cli("cancel", job_id)
    assert cluster.wait_job(job_id, timeout_s=60).state == "CANCELLED"
    ended = eventually(api, lambda s: total(s, "rota_jobs", state="CANCELLED") == 1, "the job in CANCELLED")
    assert total(ended, "rota_node_gpus", state="allocated") == 0
    print(json.dumps({"scraped": endpoints}, indent=1))
