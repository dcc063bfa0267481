"""Rota's metrics read by Prometheus itself (Debian's `prometheus` package; .ci/run installs it):
`promtool check metrics` passes every endpoint's page, a real Prometheus scrapes the local
cluster with deploy/prometheus.yml (its discovery swapped for the cluster's addresses) and
answers for the allocated GPUs, and every series the Grafana dashboards query exists in it."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster import REPO, RunningCluster, own_cluster, wait_until

pytestmark = pytest.mark.e2e

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
# The deploy file's DNS names -> the local cluster's processes (cluster.json's `metrics`).
LOCAL_NAMES = {"agent-1": "node-1", "agent-2": "node-2"}
SCRAPE_INTERVAL = "1s"  # the deploy file's 15s, shortened so the test waits seconds, not minutes


def deploy_files() -> Any:
    """tests/unit/test_deploy_files.py: its reading of the dashboards' PromQL."""
    spec = importlib.util.spec_from_file_location("deploy_files", REPO / "tests" / "unit" / "test_deploy_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "prometheus", nodes=2, gpus_per_node=2)


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run does)")
def test_promtool_passes_every_endpoint(cluster: RunningCluster) -> None:
    endpoints = cluster.info["metrics"]
    assert len(endpoints) >= 8  # six services and two agents
    for name, url in endpoints.items():
        text = wait_until(lambda u=url: _try(u), 30, f"{name}'s /metrics")
        checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True,
                                 timeout=60)
        print(f"promtool check metrics < {name} ({len(text.splitlines())} lines): rc {checked.returncode}"
              f" {checked.stdout.strip()} {checked.stderr.strip()}")
        assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), (name, checked)


def _try(url: str) -> str | None:
    try:
        return page(url)
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_config(endpoints: dict[str, str], own: str) -> dict[str, Any]:
    """deploy/prometheus.yml with each DNS name as a static target of the same name (the
    shipped relabelling reads __meta_dns_name, so the static target carries it)."""
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = SCRAPE_INTERVAL
    for job in config["scrape_configs"]:
        if job["job_name"] == "prometheus":
            job["static_configs"] = [{"targets": [own]}]
            continue
        names = [n for sd in job.pop("dns_sd_configs") for n in sd["names"]]
        job["static_configs"] = [
            {"targets": [urllib.parse.urlparse(endpoints[LOCAL_NAMES.get(n, n)]).netloc], "labels": {"__meta_dns_name": n}}
            for n in names
        ]
    return config


@pytest.fixture(scope="module")
def prometheus(cluster: RunningCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; .ci/run does)")
    folder = tmp_path_factory.mktemp("prometheus")
    address = f"127.0.0.1:{_free_port()}"
    (folder / "prometheus.yml").write_text(yaml.safe_dump(local_config(cluster.info["metrics"], address)))
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen([str(PROMETHEUS), f"--config.file={folder / 'prometheus.yml'}",
                                f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={address}"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _try(f"http://{address}/-/ready"), 60, "Prometheus ready")
        yield f"http://{address}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def api(base: str, path: str, **params: str) -> Any:
    reply = json.loads(page(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
    assert reply["status"] == "success", reply
    return reply["data"]


def test_prometheus_scrapes_the_cluster_and_sees_the_allocated_gpus(cluster: RunningCluster, prometheus: str) -> None:
    def healthy() -> list[dict[str, Any]] | None:
        targets = api(prometheus, "targets")["activeTargets"]
        return targets if len(targets) >= 9 and all(t["health"] == "up" for t in targets) else None

    targets = wait_until(healthy, 60, "every target up")
    services = sorted(t["labels"].get("service", "") for t in targets if t["labels"]["job"] != "prometheus")
    assert services == ["agent-1", "agent-2", "allocator", "api", "checkpoint", "detector", "forecaster", "ledger"]
    job = cluster.submit_job("hold", ["sleep", "60"], gpus=2)
    cluster.wait_job(job, ("RUNNING",), timeout_s=60)
    query = 'sum(rota_node_gpus{state="allocated", service="api"})'

    def allocated() -> float | None:
        result = api(prometheus, "query", query=query)["result"]
        return float(result[0]["value"][1]) if result and float(result[0]["value"][1]) == 2 else None

    value = wait_until(allocated, 60, f"{query} == 2")
    print(f"Prometheus {query} = {value}")
    cluster.cli("cancel", job)


def test_every_series_the_dashboards_query_exists_in_prometheus(cluster: RunningCluster, prometheus: str) -> None:
    module = deploy_files()
    wanted: dict[str, list[str]] = {}
    for where, expr in module.dashboard_queries():
        variable = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", expr)  # a Grafana variable's query
        for name in module.promql_names(variable.group(1) if variable else expr)[0]:
            wanted.setdefault(name, []).append(where)
    assert wanted

    def missing() -> set[str]:
        present = set(api(prometheus, "label/__name__/values"))
        return set(wanted) - present

    deadline = time.monotonic() + 30
    while (absent := missing()) and time.monotonic() < deadline:
        time.sleep(1)
    # A labelled counter or histogram has no sample before its first event (a checkpoint, a
    # verdict, a database error); Prometheus still knows its family from the scraped page's
    # TYPE and HELP lines (its metadata API). Anything else is a name no endpoint serves.
    metadata = api(prometheus, "metadata")
    declared = {n for n in absent if _family(n) in metadata}
    print(f"dashboards query {len(wanted)} series: {len(wanted) - len(absent)} with samples in Prometheus, "
          f"{len(declared)} declared by a scraped page with no sample yet: {sorted(declared)}")
    unknown = absent - declared
    assert not unknown, {name: wanted[name] for name in unknown}


def _family(series: str) -> str:
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series
