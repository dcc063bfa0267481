"""The api's JSON over HTTP (rota.api.http_gateway) on a real local cluster, and `rota submit`
over it: the same jobs, errors and idempotency as over gRPC; refusals name the field or
the reason with Connect's codes and HTTP statuses; the CLI takes gRPC when told to
(ROTA_HTTP_ENDPOINT=none) and prints the same."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster

pytestmark = pytest.mark.e2e
SPEC = {"name": "http-job", "tenant": "demo", "kind": "JOB_KIND_TRAINING", "priority": 3, "gpus": 1,
        "command": ["sleep", "0.2"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "http", nodes=1, gpus_per_node=1)


def post(cluster: RunningCluster, method: str, body: Any, *, token: str | None = "admin",
         headers: dict[str, str] | None = None, verb: str = "POST") -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {cluster.token if token == 'admin' else token}"
    request = urllib.request.Request(f"{cluster.info['http_endpoint']}/{method}", data=data if verb == "POST" else None,
                                     headers=sent, method=verb)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_job_submitted_as_json_is_the_job_grpc_reads_and_a_retry_finds_it(cluster: RunningCluster) -> None:
    request_id = str(uuid.uuid4())
    status, first = post(cluster, "rota.v1.JobService/SubmitJob", {"spec": SPEC, "requestId": request_id})
    assert status == 200 and first["created"] is True
    job_id = first["job"]["id"]
    with cluster.client() as client:
        job = client.get_job(job_id)
    assert (job.name, job.tenant, job.priority) == ("http-job", "demo", 3)
    status, again = post(cluster, "rota.v1.JobService/SubmitJob", {"spec": SPEC, "requestId": request_id})
    assert status == 200 and again["job"]["id"] == job_id and not again.get("created")
    status, read = post(cluster, "rota.v1.JobService/GetJob", {"id": job_id})
    assert status == 200 and read["job"]["id"] == job_id


@pytest.mark.parametrize(("method", "body", "headers", "token", "status", "code", "field"), [
    ("rota.v1.JobService/SubmitJob", {"spec": {**SPEC, "priority": 99}}, {}, "admin", 400, "invalid_argument", "priority"),
    ("rota.v1.JobService/SubmitJob", {"spec": 3}, {}, "admin", 400, "invalid_argument", "request"),
    ("rota.v1.JobService/SubmitJob", {"spec": SPEC}, {}, None, 401, "unauthenticated", ""),
    ("rota.v1.JobService/SubmitJob", {"spec": SPEC}, {}, "rt_not-a-token", 401, "unauthenticated", ""),
    ("rota.v1.JobService/GetJob", {"id": "j-nothere"}, {}, "admin", 404, "not_found", ""),
    ("rota.v1.JobService/NoSuchMethod", {}, {}, "admin", 404, "not_found", ""),
    ("rota.v1.JobService/SubmitJob", {"spec": SPEC}, {"Content-Type": "text/plain"}, "admin", 415, "invalid_argument", ""),
    ("rota.v1.JobService/SubmitJob", {"spec": SPEC}, {"Connect-Timeout-Ms": "soon"}, "admin", 400, "invalid_argument", ""),
])
def test_refusals_carry_connect_codes_and_name_the_field(
    cluster: RunningCluster, method: str, body: Any, headers: dict[str, str], token: str | None, status: int,
    code: str, field: str,
) -> None:
    got, error = post(cluster, method, body, token=token, headers=headers)
    assert (got, error["code"]) == (status, code), error
    assert error["message"]
    assert error.get("field", "") == field


def test_only_post_is_served(cluster: RunningCluster) -> None:
    status, error = post(cluster, "rota.v1.JobService/GetJob", b"", verb="GET")
    assert status == 405 and "only POST" in error["message"]


def cli(cluster: RunningCluster, *args: str, grpc: bool) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    if grpc:
        env["ROTA_HTTP_ENDPOINT"] = "none"
    return subprocess.run([sys.executable, "-m", "rota.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_rota_submit_over_http_prints_what_it_prints_over_grpc(cluster: RunningCluster, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: cli-http\ntenant: demo\ngpus: 1\ncommand: [sleep, '0.2']\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: cli-bad\ntenant: demo\ngpus: 1\npriority: 99\ncommand: [sleep, '0.2']\n")
    for grpc in (False, True):
        one = json.loads(cli(cluster, "submit", str(good), "--json", grpc=grpc).stdout)
        assert set(one) == {"id", "state"} and one["state"] == "PENDING"
        many = cli(cluster, "submit", str(good), str(bad), "--json", grpc=grpc)
        rows = json.loads(many.stdout)
        assert many.returncode == 1 and rows[0]["file"] == str(good) and rows[0]["id"].startswith("j-")
        assert rows[1] == {"file": str(bad), "error": "INVALID_ARGUMENT: priority: must be between 1 and 10 (got 99)"}
        refused = cli(cluster, "submit", str(bad), grpc=grpc)
        assert refused.returncode == 1
        assert refused.stderr.strip() == "rota: INVALID_ARGUMENT: priority: must be between 1 and 10 (got 99)"
        array = json.loads(cli(cluster, "submit", str(good), "--array", "0-2", "--json", grpc=grpc).stdout)
        assert array["count"] == 3 and array["jobs"] == [f"{array['array']}_{i}" for i in range(3)]
    with cluster.client() as client:
        assert client.get_job(one["id"]).name == "cli-http"


def test_rota_submit_over_http_loads_no_grpc(cluster: RunningCluster, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: cli-lean\ntenant: demo\ngpus: 1\ncommand: [sleep, '0.2']\n")
    probe = ("import runpy, sys\nsys.argv = ['rota', 'submit', sys.argv[1], '--json']\n"
             "try:\n    runpy.run_module('rota.cli.main', run_name='__main__')\n"
             "except SystemExit as exc:\n    print('grpc' in sys.modules, exc.code, file=sys.stderr)\n")
    env = cluster.env()
    done = subprocess.run([sys.executable, "-c", probe, str(good)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert json.loads(done.stdout)["state"] == "PENDING"
    assert done.stderr.split()[-2:] == ["False", "0"], done.stderr


def test_one_connection_carries_several_requests_and_garbage_is_refused(cluster: RunningCluster) -> None:
    import socket

    host, _, port = cluster.info["http_endpoint"].removeprefix("http://").rpartition(":")
    body = json.dumps({"id": "j-nothere"}).encode()
    request = (f"POST /rota.v1.JobService/GetJob HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {cluster.token}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(2):  # kept alive: the second request on the same connection
            sock.sendall(request)
            assert reader.readline().split()[1] == b"404"
            headers = list(iter(reader.readline, b"\r\n"))  # up to the blank line
            length = next(int(line.split(b":")[1]) for line in headers if line.lower().startswith(b"content-length"))
            assert json.loads(reader.read(length))["code"] == "not_found"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"HELLO\r\n\r\n")
        answer = sock.makefile("rb").read()  # answered, then closed
    assert answer.split()[1] == b"400" and b"not an HTTP/1.x request line" in answer
