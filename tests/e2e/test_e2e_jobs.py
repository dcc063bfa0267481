"""A real local cluster runs real PyTorch jobs submitted through the CLI and the SDK."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from cluster import REPO, RunningCluster, processes_of

from rota.client import (
    InvalidArgumentError,
    NotFoundError,
    UnauthenticatedError,
    job_spec_from_mapping,
    load_job_file,
)


def test_the_example_job_submitted_through_the_cli_succeeds_with_its_loss_in_progress(cluster: RunningCluster) -> None:
    # With tenant demo's token: the example names no tenant, the token's is taken.
    submitted = cluster.cli_json("submit", "examples/train-small.yaml", token=cluster.demo_token)
    cluster.wait_job(submitted["id"])
    job = cluster.cli_json("job", submitted["id"])
    assert job["state"] == "SUCCEEDED", job
    assert job["progress"]["step"] == 300
    assert math.isfinite(job["progress"]["loss"]) and job["progress"]["loss"] < 1.0
    assert job["node"] and len(job["gpus"]) == 1
    assert [h["to"] for h in job["history"]] == ["SCHEDULED", "RUNNING", "SUCCEEDED"]


def test_the_example_job_submitted_through_the_sdk_succeeds(cluster: RunningCluster) -> None:
    data = {"tenant": "demo", **load_job_file(REPO / "examples" / "train-2gpu.yaml")}  # the admin names it
    spec = job_spec_from_mapping(data, base_dir=REPO)
    with cluster.client() as client:
        job = client.submit(spec=spec)
        finished = client.wait(job.id)
    assert finished.state == "SUCCEEDED", finished.reason
    assert len(finished.gpus) == 2 and finished.gpus[0] % 2 == 0
    assert finished.progress["step"] > 0 and math.isfinite(finished.progress["loss"])


def test_a_failing_job_reaches_failed_with_its_error(cluster: RunningCluster) -> None:
    submitted = cluster.cli_json("submit", "examples/fail.yaml", token=cluster.demo_token)
    job = cluster.wait_job(submitted["id"])
    assert job.state == "FAILED"
    assert job.exit_code != 0
    assert "simulated failure" in job.error
    # Cancelling what has finished changes nothing, and says so.
    again = cluster.cli("cancel", job.id)
    assert again.stdout == f"{job.id}: already FAILED, nothing to cancel\n" and again.stderr == ""
    assert cluster.wait_job(job.id).state == "FAILED"


def test_cancelling_a_running_job_leaves_no_process_behind(cluster: RunningCluster) -> None:
    submitted = cluster.cli_json("submit", "examples/sleep.yaml", token=cluster.demo_token)
    cluster.wait_job(submitted["id"], ("RUNNING",))
    deadline = time.monotonic() + 20
    while not processes_of(submitted["id"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of(submitted["id"]), "the job should be running as processes"
    cancelled = cluster.cli_json("cancel", submitted["id"])
    assert cancelled["state"] == "CANCELLED"
    deadline = time.monotonic() + 15
    while processes_of(submitted["id"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of(submitted["id"]) == []
    # The stopped process's exit (143: SIGTERM) reaches the job with the agent's next beat.
    deadline = time.monotonic() + 15
    while (job := cluster.cli_json("job", submitted["id"]))["exit_code"] != 143 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (job["state"], job["exit_code"]) == ("CANCELLED", 143), job
    assert all(h["at"].endswith("Z") for h in job["history"]) and job["finished_at"].endswith("Z"), job
    assert "exit code: 143" in cluster.cli("job", submitted["id"]).stdout


def test_jobs_watch_redraws_the_filtered_table_until_stopped(cluster: RunningCluster) -> None:
    running = cluster.cli_json("submit", "examples/sleep.yaml", token=cluster.demo_token)["id"]
    cluster.wait_job(running, ("RUNNING",))
    result = cluster.cli("jobs", "--watch", "--interval", "0.5", "--count", "3", "--state", "RUNNING")
    frames = result.stdout.strip().split("\n\n")  # not a terminal: successive plain tables
    assert len(frames) == 3 and "\033" not in result.stdout, result.stdout
    for frame in frames:
        header, columns, *rows = frame.splitlines()
        assert header.startswith("jobs at ") and columns.split()[:2] == ["ID", "NAME"], frame
        assert any(row.split()[0] == running for row in rows) and all(" RUNNING " in row for row in rows), frame
    # Without --count it refreshes until Ctrl-C, which ends it with status 0 and no error.
    watch = subprocess.Popen([sys.executable, "-m", "rota.cli.main", "jobs", "--watch", "--interval", "0.5"],
                             cwd=REPO, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watch.stdout is not None
    first = watch.stdout.readline()  # the first frame is out: the watch is in its loop
    time.sleep(1.2)
    watch.send_signal(signal.SIGINT)
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0 and err == "" and (first + out).count("jobs at ") >= 2, (watch.returncode, err)
    cluster.cli("cancel", running)


def test_a_mistyped_state_filter_names_the_flag_and_the_states(cluster: RunningCluster) -> None:
    typo = cluster.cli("jobs", "--state", "RUNNIN", check=False)
    assert typo.returncode == 1 and typo.stdout == ""
    assert typo.stderr == ("rota: --state: unknown state 'RUNNIN' (one of PENDING, SCHEDULED, RUNNING, PAUSED, "
                           "SUCCEEDED, FAILED, CANCELLED, LOST)\n")
    assert cluster.cli("jobs", "--state", "running").returncode == 0  # any case


def test_logs_show_what_the_job_printed(cluster: RunningCluster) -> None:
    submitted = cluster.cli_json("submit", "examples/fail.yaml", token=cluster.demo_token)
    cluster.wait_job(submitted["id"])
    out = cluster.cli("logs", submitted["id"]).stdout
    assert "simulated failure: bad shard 3" in out


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("tenant: demo\nkind: training\ngpus: 3\ncommand: [python, -c, pass]\n", "gpus"),
        # (gpus: 64 is a gang of whole nodes now, held until nodes join; per node it is refused)
        ("tenant: demo\nkind: training\nnodes: 2\ngpus_per_node: 64\ncommand: [python, -c, pass]\n", "gpus_per_node"),
        ("tenant: demo\nkind: training\nnodes: 3\ngpus_per_node: 1\ncommand: [python, -c, pass]\n", "nodes"),
        ("tenant: demo\nkind: training\ngpu_types: [A100]\ncommand: [python, -c, pass]\n", "gpu_types[0]"),
        ("tenant: demo\nkind: painting\ngpus: 1\ncommand: [python]\n", "kind"),
        ("tenant: demo\nkind: training\ngpus: 1\ncommand: []\n", "command"),
        ("tenant: demo\nkind: training\ngpus: 1\nduration: 0\ncommand: [python]\n", "duration"),
        ("tenant: nobody\nkind: training\ngpus: 1\ncommand: [python]\n", "tenant"),
        ("tenant: demo\nkind: training\npriority: 11\ngpus: 1\ncommand: [python]\n", "priority"),
        ("tenant: demo\nkind: [unclosed\n", "file"),
    ],
)
def test_bad_submissions_exit_non_zero_with_one_line_naming_the_field(
    cluster: RunningCluster, tmp_path: Path, body: str, field: str
) -> None:
    before = len(cluster.cli_json("jobs"))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(body)
    result = cluster.cli("submit", str(job_file), check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert f"{field}:" in lines[0], result.stderr
    # One line; a YAML error's parser message (its marks and caret) follows it, indented.
    assert len(lines) == 1 or (field == "file" and all(line.startswith("  ") for line in lines[1:])), result.stderr
    assert len(cluster.cli_json("jobs")) == before, "nothing is stored for a bad submission"


def test_a_tenant_sees_only_its_own_jobs_and_needs_a_token(cluster: RunningCluster) -> None:
    other = cluster.cli_json("tenants", "add", "other")
    with cluster.client() as admin:
        spec = job_spec_from_mapping({"tenant": "demo", **load_job_file(REPO / "examples" / "fail.yaml")}, base_dir=REPO)
        demo_job = admin.submit(spec=spec)
    with cluster.client(token=other["token"]) as client:
        with pytest.raises(NotFoundError):
            client.get_job(demo_job.id)
        with pytest.raises(NotFoundError):
            client.cancel(demo_job.id)
        assert all(j.tenant == "other" for j in client.list_jobs())
        with pytest.raises(InvalidArgumentError) as bad:
            client.submit(spec=dataclasses.replace(spec, tenant="demo"))
        assert bad.value.field == "tenant"
        assert client.whoami() == (False, "other")
    with cluster.client() as admin:
        assert admin.whoami() == (True, "")
    with cluster.client(token="rt_not-a-token") as client:
        with pytest.raises(UnauthenticatedError):
            client.list_jobs()
        with pytest.raises(UnauthenticatedError):
            client.whoami()


def test_a_token_with_a_lifetime_expires_and_a_reissued_token_replaces_the_old_one(cluster: RunningCluster) -> None:
    brief = cluster.cli_json("tenants", "add", "brief", "--token-ttl", "2s")
    assert brief["token_expires_at"] is not None
    with cluster.client(token=brief["token"]) as client:
        assert client.list_jobs() == []
        time.sleep(2.2)
        with pytest.raises(UnauthenticatedError) as expired:
            client.list_jobs()
        assert "expired" in str(expired.value)
    renewed = cluster.cli_json("tenants", "token", "brief")
    assert renewed["token_expires_at"] is None and renewed["token"] != brief["token"]
    with cluster.client(token=renewed["token"]) as client:
        assert client.list_jobs() == []
    listed = {t["name"]: t for t in cluster.cli_json("tenants", "list")}
    assert listed["brief"]["token_expires_at"] is None
    with cluster.client() as admin:
        with pytest.raises(InvalidArgumentError) as negative:
            admin.issue_token("brief", ttl=timedelta(seconds=-5))
        assert negative.value.field == "token_ttl"
        with pytest.raises(NotFoundError):
            admin.issue_token("nobody-by-this-name")


def test_a_retried_submission_with_the_same_request_id_creates_one_job(cluster: RunningCluster) -> None:
    spec = job_spec_from_mapping({"tenant": "demo", **load_job_file(REPO / "examples" / "fail.yaml")}, base_dir=REPO)
    with cluster.client() as client:
        first = client.submit(spec=spec, request_id="retry-1")
        again = client.submit(spec=spec, request_id="retry-1")
        assert again.id == first.id
        from rota.client import AlreadyExistsError

        with pytest.raises(AlreadyExistsError):
            client.submit(spec=dataclasses.replace(spec, priority=9), request_id="retry-1")


def test_several_files_in_one_submit_are_all_submitted_or_none(cluster: RunningCluster, tmp_path: Path) -> None:
    files = []
    for k in range(3):
        path = tmp_path / f"short-{k}.yaml"
        path.write_text(f"name: short-{k}\ntenant: demo\ncommand: [python, examples/sleep_job.py, --seconds, '0.5']\n")
        files.append(str(path))
    submitted = cluster.cli_json("submit", *files)
    assert [s["file"] for s in submitted] == files and len({s["id"] for s in submitted}) == 3
    for s in submitted:
        job = cluster.wait_job(s["id"])
        assert job.state == "SUCCEEDED" and job.name == Path(s["file"]).stem, job
    # A file that does not parse: nothing is sent. One the api refuses: the others go on,
    # the refusal names its file, and the exit status says one failed (a loop of sbatch).
    before = len(cluster.cli_json("jobs"))
    unreadable = tmp_path / "unreadable.yaml"
    unreadable.write_text("name: [unclosed\n")
    result = cluster.cli("submit", files[0], str(unreadable), check=False)
    assert result.returncode != 0 and "unreadable.yaml" in result.stderr, result.stderr
    assert len(cluster.cli_json("jobs")) == before
    refused = tmp_path / "refused.yaml"
    refused.write_text("name: refused\ntenant: demo\ngpus: 3\ncommand: [python, examples/sleep_job.py]\n")
    result = cluster.cli("submit", files[0], str(refused), "--json", check=False)
    rows = json.loads(result.stdout)
    assert result.returncode == 1 and "id" in rows[0] and "INVALID_ARGUMENT" in rows[1]["error"], rows
    assert f"{refused}: INVALID_ARGUMENT" in result.stderr and "gpus" in result.stderr, result.stderr
    assert len(cluster.cli_json("jobs")) == before + 1
    refused = cluster.cli("submit", files[0], files[1], "--wait", check=False)
    assert refused.returncode != 0 and "--wait: one FILE at a time" in refused.stderr, refused.stderr


def test_nodes_lists_every_node_with_its_gpus_and_health(cluster: RunningCluster) -> None:
    nodes = cluster.cli_json("nodes")
    assert sorted(n["name"] for n in nodes) == ["node-1", "node-2"]
    assert all(n["health"] == "ALIVE" and len(n["gpus"]) == 2 for n in nodes)


def test_node_rpcs_are_served_on_the_node_port_only(cluster: RunningCluster) -> None:
    """NodeService answers on the api's node port (the agents' ROTA_API_NODE_ADDR), not on the
    public endpoint, which in turn serves no NodeService, and no node RPC of any other service.
    Last in this module: the node it registers (no GPUs, so nothing is placed there) goes DEAD
    afterwards."""
    import grpc

    from rota.v1 import api_pb2, api_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

    info, metadata = cluster.info, (("authorization", f"Bearer {cluster.token}"),)
    with grpc.insecure_channel(info["endpoint"]) as public, grpc.insecure_channel(info["node_endpoint"]) as internal:
        fresh = common_pb2.Node(name="node-rpc-check", address="127.0.0.1:9")
        with pytest.raises(grpc.RpcError) as on_public:
            node_pb2_grpc.NodeServiceStub(public).Register(
                node_pb2.NodeServiceRegisterRequest(node=fresh), timeout=10, metadata=metadata)
        assert on_public.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as on_internal:
            api_pb2_grpc.JobServiceStub(internal).ListJobs(api_pb2.ListJobsRequest(), timeout=10, metadata=metadata)
        assert on_internal.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as no_admin:
            node_pb2_grpc.NodeServiceStub(internal).Heartbeat(
                node_pb2.NodeServiceHeartbeatRequest(node="node-1"), timeout=10, metadata=(("authorization", "Bearer x"),))
        assert no_admin.value.code() == grpc.StatusCode.UNAUTHENTICATED

        nodes = node_pb2_grpc.NodeServiceStub(internal)
        assert nodes.Register(node_pb2.NodeServiceRegisterRequest(node=fresh), timeout=10, metadata=metadata).node.name == fresh.name
        beat = nodes.Heartbeat(node_pb2.NodeServiceHeartbeatRequest(node=fresh.name), timeout=10, metadata=metadata)
        assert beat.health == common_pb2.NODE_HEALTH_ALIVE and not beat.assignments
        # The copies ClusterService kept before 0.3.0 are gone: the public endpoint has no node RPC.
        with pytest.raises(grpc.RpcError) as old:
            public.unary_unary("/rota.v1.ClusterService/RegisterNode")(b"", timeout=10, metadata=metadata)
        assert old.value.code() == grpc.StatusCode.UNIMPLEMENTED
