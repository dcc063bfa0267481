"""The hostile requests of `rota bench faults`: submissions replayed under client timeouts
with one request id (case 5), and the security case (7): missing, forged, expired and
replaced tokens, another tenant's jobs and arrays through every call that names one (the
console's POST actions too), oversized messages, and the TLS port's refusals."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import grpc

from rota.bench.fault_harness import TENANT, Harness, sleep_spec
from rota.bench.tls_probe import tls_cases
from rota.client import JobSpec
from rota.client._wire import spec_to_proto  # raw RPCs: replays and refusals the SDK would not send
from rota.common.bootstrap import TOKEN_CACHE_S
from rota.v1 import (
    allocator_pb2,
    allocator_pb2_grpc,
    api_pb2,
    api_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    detector_pb2,
    detector_pb2_grpc,
)

TOKEN_TTL = timedelta(seconds=2)  # the security case's short-lived token


def replays(h: Harness, rounds: int) -> dict[str, Any]:
    """Each submission sent three times under a client timeout too short to see the answer."""
    spec = short_job_spec()
    conflict_refused = True
    with h.client() as client:
        channel = grpc.insecure_channel(h.info["endpoint"])
        stub = api_pb2_grpc.JobServiceStub(channel)
        meta = (("authorization", f"Bearer {h.token}"),)
        for _ in range(rounds):
            rid = str(uuid.uuid4())
            request = api_pb2.SubmitJobRequest(spec=spec_to_proto(spec), request_id=rid)
            for _ in range(3):
                try:
                    stub.SubmitJob(request, timeout=0.002, metadata=meta)
                except grpc.RpcError:
                    pass  # DEADLINE_EXCEEDED: the client cannot tell whether it landed
            job = client.submit(spec=spec, request_id=rid)
            h.submitted.append(job.id)
            other = api_pb2.SubmitJobRequest(spec=spec_to_proto(spec), request_id=rid)
            other.spec.priority = spec.priority % 10 + 1
            try:
                stub.SubmitJob(other, timeout=10, metadata=meta)
                conflict_refused = False
            except grpc.RpcError as exc:
                conflict_refused &= exc.code() == grpc.StatusCode.ALREADY_EXISTS
        channel.close()
    by_request = h.sql(f"SELECT request_id, count(*) FROM jobs WHERE tenant = '{TENANT}' AND request_id IS NOT NULL "
                       "GROUP BY request_id HAVING count(*) > 1")
    return {"rounds": rounds, "duplicates": len(by_request), "different_body_already_exists": conflict_refused}


def short_job_spec() -> JobSpec:
    return sleep_spec(0.5, interval=0.1)


def security(h: Harness) -> dict[str, Any]:
    """Each hostile call and the status it must get; `ok` is whether it got exactly that."""
    results: dict[str, Any] = {}
    channel = grpc.insecure_channel(h.info["endpoint"])
    jobs = api_pb2_grpc.JobServiceStub(channel)

    def expect(name: str, want: grpc.StatusCode, call: Callable[[], Any]) -> None:
        try:
            call()
            got = "OK"
        except grpc.RpcError as exc:
            got = exc.code().name
        results[name] = {"expected": want.name, "got": got, "ok": got == want.name}

    def list_as(token: str) -> Callable[[], Any]:
        return lambda: jobs.ListJobs(api_pb2.ListJobsRequest(), timeout=10, metadata=(("authorization", f"Bearer {token}"),))

    with h.client() as admin:
        other_token = admin.create_tenant("faults-other-" + uuid.uuid4().hex[:6])[1]
        issued_at = time.monotonic()
        short_lived = admin.create_tenant("faults-brief-" + uuid.uuid4().hex[:6], token_ttl=TOKEN_TTL)[1]
        expect("token_before_expiry", grpc.StatusCode.OK, list_as(short_lived))
        replaced, first_token = admin.create_tenant("faults-moved-" + uuid.uuid4().hex[:6])
        expect("token_before_replacement", grpc.StatusCode.OK, list_as(first_token))  # now cached
        admin.issue_token(replaced.name)
        victim = h.submitted[0] if h.submitted else h.submit(1, 0.5)[0]
        # An array of the suite's tenant, running (at most one task at once): not in h.submitted,
        # cancelled by its owner's side (the admin) once the hostile calls are made.
        array = admin.submit_array(spec=sleep_spec(30, interval=0.5), indices="0-1%1").id

    get = api_pb2.GetJobRequest(id=victim)
    expect("no_token", grpc.StatusCode.UNAUTHENTICATED, lambda: jobs.GetJob(get, timeout=10))
    expect("bad_token", grpc.StatusCode.UNAUTHENTICATED,
           lambda: jobs.GetJob(get, timeout=10, metadata=(("authorization", "Bearer rt_forged"),)))
    # Past its expiry a token is refused at once; a replaced one once the api's cached
    # lookup of it has expired.
    time.sleep(max(0.0, issued_at + max(TOKEN_TTL.total_seconds(), TOKEN_CACHE_S) - time.monotonic()) + 0.2)
    expect("expired_token", grpc.StatusCode.UNAUTHENTICATED, list_as(short_lived))
    expect("replaced_token", grpc.StatusCode.UNAUTHENTICATED, list_as(first_token))
    as_other = (("authorization", f"Bearer {other_token}"),)
    expect("other_tenants_job", grpc.StatusCode.NOT_FOUND, lambda: jobs.GetJob(get, timeout=10, metadata=as_other))
    foreign = api_pb2.SubmitJobRequest(spec=spec_to_proto(short_job_spec()))
    expect("body_names_another_tenant", grpc.StatusCode.INVALID_ARGUMENT,
           lambda: jobs.SubmitJob(foreign, timeout=10, metadata=as_other))
    huge = api_pb2.SubmitJobRequest(spec=spec_to_proto(short_job_spec()), request_id="x")
    huge.spec.env["PAD"] = "x" * (5 * 1024 * 1024)
    expect("oversized_message", grpc.StatusCode.RESOURCE_EXHAUSTED,
           lambda: jobs.SubmitJob(huge, timeout=10, metadata=(("authorization", f"Bearer {h.token}"),)))
    results.update(cross_tenant_cases(h, channel, as_other, victim, array))
    with h.client() as admin:
        admin.cancel_array(array, reason="the security case is over")
    results.update(tls_cases())  # a TLS server of its own: this cluster runs in plaintext
    channel.close()
    return results


def cross_tenant_cases(h: Harness, channel: grpc.Channel, as_other: tuple[tuple[str, str], ...], victim: str,
                       array: str) -> dict[str, Any]:
    """Every call that names a job or an array, made with another tenant's token on the
    suite's tenant's: each reads as missing (NOT_FOUND, as GetJob answers), so ids cannot
    be probed, and the job or array is left as it was."""
    results: dict[str, Any] = {}
    jobs = api_pb2_grpc.JobServiceStub(channel)
    checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
    detector = detector_pb2_grpc.DetectorServiceStub(channel)
    allocator = allocator_pb2_grpc.AllocatorServiceStub(channel)
    task = f"{array}_0"
    calls: dict[str, Callable[[], Any]] = {
        "other_tenants_array_cancel": lambda: jobs.CancelJob(api_pb2.CancelJobRequest(id=array), timeout=10, metadata=as_other),
        "other_tenants_array_read": lambda: jobs.GetJobArray(api_pb2.GetJobArrayRequest(id=array), timeout=10,
                                                             metadata=as_other),
        "other_tenants_job_cancel": lambda: jobs.CancelJob(api_pb2.CancelJobRequest(id=task), timeout=10, metadata=as_other),
        "other_tenants_job_pause": lambda: checkpoints.Pause(checkpoint_pb2.PauseRequest(job_id=task), timeout=10,
                                                             metadata=as_other),
        "other_tenants_job_resume": lambda: checkpoints.Resume(checkpoint_pb2.ResumeRequest(job_id=victim), timeout=10,
                                                               metadata=as_other),
        "other_tenants_job_checkpoint": lambda: checkpoints.Checkpoint(checkpoint_pb2.CheckpointRequest(job_id=task),
                                                                       timeout=10, metadata=as_other),
        "other_tenants_job_migrate": lambda: checkpoints.Migrate(checkpoint_pb2.MigrateRequest(job_id=task), timeout=10,
                                                                 metadata=as_other),
        "other_tenants_job_replan_apply": lambda: detector.Replan(
            detector_pb2.ReplanRequest(job_id=task, apply=True), timeout=10, metadata=as_other),
        "other_tenants_job_explain": lambda: allocator.Explain(allocator_pb2.ExplainRequest(job_id=task), timeout=10,
                                                               metadata=as_other),
        "other_tenants_job_logs": lambda: list(jobs.StreamLogs(api_pb2.StreamLogsRequest(id=task), timeout=10,
                                                               metadata=as_other)),
    }
    for name, call in calls.items():
        try:
            call()
            got = "OK"
        except grpc.RpcError as exc:
            got = exc.code().name
        results[name] = {"expected": "NOT_FOUND", "got": got, "ok": got == "NOT_FOUND"}
    console = h.info.get("console")
    if console:  # the console's POST actions, with the other tenant's token: the api's refusal
        for action in ("cancel", "pause", "resume"):
            got_status = console_post(str(console), f"/jobs/{task}/{action}", as_other[0][1])
            results[f"other_tenants_console_{action}"] = {"expected": 404, "got": got_status, "ok": got_status == 404}
    with h.client() as admin:
        untouched = [admin.get_job(f"{array}_{i}").state for i in range(2)]
    results["other_tenants_calls_changed_nothing"] = {
        "expected": "no task cancelled or paused", "got": untouched,
        "ok": not {"CANCELLED", "PAUSED"} & set(untouched)}
    return results


def console_post(console: str, path: str, authorization: str) -> int:
    """The HTTP status of a console POST (a JSON call: `Authorization: Bearer ...`)."""
    request = urllib.request.Request(console + path, data=b"", method="POST",
                                     headers={"Authorization": authorization})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=15) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
