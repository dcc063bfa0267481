"""`rota up --tls`: a real local cluster with mutual TLS on every port runs a job end to end
through the CLI; plaintext and certificate-less clients are refused; a tenant's client
certificate, with no token, sees only that tenant's jobs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster import REPO, RunningCluster, start_cluster
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rota.cli.certs import issue_tenant, make_ca

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    url = databases.create()
    running = start_cluster(tmp_path_factory.mktemp("tls-cluster") / "home", url, redis_url, nodes=1, tls=True)
    try:
        running.cli("tenants", "add", "demo")
        running.cli("tenants", "add", "other")
        yield running
    finally:
        running.stop()
        databases.drop(url)


def _health(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    with channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_job_runs_end_to_end_over_tls_through_the_cli(cluster: RunningCluster) -> None:
    submitted = cluster.cli_json("submit", "examples/train-small.yaml", "--tenant", "demo")  # the admin names it
    cluster.wait_job(submitted["id"])
    job = cluster.cli_json("job", submitted["id"])
    assert job["state"] == "SUCCEEDED", job
    assert job["progress"]["step"] == 300
    assert [h["to"] for h in job["history"]] == ["SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert [n["health"] for n in cluster.cli_json("nodes")] == ["ALIVE"]  # the agent reports over TLS


def test_the_certificates_are_private_and_every_process_uses_them(cluster: RunningCluster) -> None:
    info = cluster.info
    tls_dir = cluster.home / "tls"
    assert set(info["tls"]) == {"ca", "cert", "key"}
    assert all(Path(p).parent == tls_dir.resolve() for p in info["tls"].values())
    for path in tls_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for name, pid in info["pids"].items():
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        assert env["ROTA_TLS_CA"] == info["tls"]["ca"], name
        assert Path(env["ROTA_TLS_CERT"]).name == "service.pem", name


def test_every_port_refuses_plaintext_and_certificate_less_clients(cluster: RunningCluster) -> None:
    info = cluster.info
    ca_only = grpc.ssl_channel_credentials(root_certificates=Path(info["tls"]["ca"]).read_bytes())
    targets = [*info["services"].values(), info["node_endpoint"], *(a["address"] for a in info["agents"].values())]
    assert len(targets) == 8
    for target in targets:
        assert _health(target, None) == grpc.StatusCode.UNAVAILABLE, target
        assert _health(target, ca_only) == grpc.StatusCode.UNAVAILABLE, target
    with cluster.client() as client:  # the recorded client certificate gets in
        assert client.nodes()


def _tenant_cli(cluster: RunningCluster, tenant: str, *args: str) -> Any:
    """`rota ARGS --json` with only a tenant's client certificate: no token, no ROTA_HOME."""
    tls_dir = cluster.home / "tls"
    cert = issue_tenant(make_ca(tls_dir), tenant, cluster.home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env.update({"ROTA_ENDPOINT": cluster.info["endpoint"], "ROTA_TLS_CA": str(tls_dir / "ca.pem"),
                "ROTA_TLS_CERT": str(cert.cert), "ROTA_TLS_KEY": str(cert.key)})
    result = subprocess.run([sys.executable, "-m", "rota.cli.main", *args, "--json"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_tenant_certificate_without_a_token_sees_only_that_tenants_jobs(cluster: RunningCluster) -> None:
    theirs = cluster.cli_json("submit", "examples/sleep.yaml", "--tenant", "other")
    mine = _tenant_cli(cluster, "demo", "submit", "examples/sleep.yaml")
    try:
        listed = _tenant_cli(cluster, "demo", "jobs")
        assert {j["tenant"] for j in listed} == {"demo"}
        assert mine["id"] in {j["id"] for j in listed}
        assert theirs["id"] not in {j["id"] for j in listed}
        assert {j["tenant"] for j in _tenant_cli(cluster, "other", "jobs")} == {"other"}
    finally:
        cluster.cli("cancel", mine["id"])
        cluster.cli("cancel", theirs["id"])
