"""Applied re-plans and devices out of the plan, on a real PostgreSQL through gRPC.

The detector runs in-process with the real interceptor; the checkpoint service is a fake
port that records the Migrate it is asked for (the real one is exercised end to end in
tests/e2e/test_e2e_detector.py). The allocator's own repository functions read what the
detector stored: the layout a job's next launch carries, and the GPUs no plan may use.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import grpc
import pytest
from detector_fixtures import node_with, report_requests, running_job, tenant
from opentelemetry import trace

from rota.allocator.loop import SchedulingLoop
from rota.client import (
    Client,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from rota.cluster import job_lifecycle, job_starts, planner_view
from rota.cluster.job_lifecycle import Events, get_job
from rota.common import read_models
from rota.common.bootstrap import TokenAuthenticator
from rota.common.db import Database
from rota.common.layouts import layout_text
from rota.common.server import RotaInterceptor
from rota.core import jobstate
from rota.core.detection.devices import DeviceMark
from rota.core.detection.failslow import DetectorConfig
from rota.core.errors import FailedPrecondition
from rota.core.planning.liveplan import Horizon, Start
from rota.core.planning.planner import plan_live
from rota.detector import repository as detector_repo
from rota.detector.applier import MigrateFailed, MigrationGoesOn
from rota.detector.service import DetectorService
from rota.v1 import checkpoint_pb2, detector_pb2, detector_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)
CONFIG = DetectorConfig(threshold=1.1, consecutive=5, warmup=20)
META = (("authorization", f"Bearer {ADMIN}"),)


@dataclass
class FakeCheckpoint:
    """Answers Migrate as the checkpoint service would, or fails as told."""

    calls: list[checkpoint_pb2.MigrateRequest] = field(default_factory=list)
    fail: MigrateFailed | None = None

    async def migrate(self, request: checkpoint_pb2.MigrateRequest, timeout_s: float) -> checkpoint_pb2.MigrateResponse:
        assert 0 < timeout_s < 300  # bounded by the caller's deadline
        self.calls.append(request)
        if self.fail is not None:
            raise self.fail
        return checkpoint_pb2.MigrateResponse(node="n-next", gpus=[0, 1], image_id="img-7", step=120, from_node="n-was")


@dataclass
class Server:
    endpoint: str
    service: DetectorService
    loop: asyncio.AbstractEventLoop
    clock: list[float]
    checkpoint: FakeCheckpoint

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=20)


@pytest.fixture(scope="module")
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as private:
        yield private


@pytest.fixture(scope="module")
def server(db: Database) -> Iterator[Server]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    clock = [1_000_000.0]
    checkpoint = FakeCheckpoint()
    service = DetectorService(db, None, config=CONFIG, heartbeat_interval_s=1.0, now=lambda: clock[0],
                              checkpoint=checkpoint)

    async def start() -> tuple[grpc.aio.Server, int]:
        interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db),
                                      default_deadline_s=20)
        srv = grpc.aio.server(interceptors=[interceptor])
        detector_pb2_grpc.add_DetectorServiceServicer_to_server(service, srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        return srv, port

    srv, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    yield Server(f"127.0.0.1:{port}", service, loop, clock, checkpoint)
    asyncio.run_coroutine_threadsafe(srv.stop(0), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    server.checkpoint.calls.clear()
    server.checkpoint.fail = None
    with Client.connect(server.endpoint, token=ADMIN, timeout=timedelta(seconds=20)) as c:
        yield c


def report(detector: detector_pb2_grpc.DetectorServiceStub, job_id: str, epoch: int, factor: float,
           iterations: int = 80) -> list[detector_pb2.Verdict]:
    """A 2x2x1 job's reports with rank 3 slow by `factor` from iteration 40; the verdicts."""
    faults = [{"kind": "slow", "rank": 3, "factor": factor, "from_iter": 40}]
    found: list[detector_pb2.Verdict] = []
    for request in report_requests(job_id, epoch, faults, iterations):
        found += detector.ReportIteration(request, metadata=META).verdicts
    return found


def slow_job(server: Server, db: Database, factor: float = 1.3, **spec: Any) -> tuple[str, str, int]:
    owner, _ = tenant(db)
    job_id, node, epoch = running_job(db, owner, **spec)
    with grpc.insecure_channel(server.endpoint) as channel:
        [verdict] = report(detector_pb2_grpc.DetectorServiceStub(channel), job_id, epoch, factor)
    assert (verdict.rank, verdict.verdict_kind) == (3, detector_pb2.VERDICT_KIND_SLOW)
    return job_id, node, epoch


# 1. Applying a re-plan.
def test_an_applied_replan_stores_the_layout_migrates_the_job_and_its_next_launch_carries_it(
    server: Server, db: Database, client: Client,
) -> None:
    job_id, _, epoch = slow_job(server, db, accepts_layout_changes=True)
    shown = client.replan(job_id=job_id)
    assert not shown.applied and server.checkpoint.calls == []  # without --apply nothing happens
    assert db.run(lambda s: read_models.applied_layout(s, job_id)) == ""

    applied = client.replan(job_id=job_id, apply=True, wait=timedelta(seconds=5))
    [call] = server.checkpoint.calls
    assert (call.job_id, call.wait_seconds) == (job_id, 5.0) and call.operation_id.startswith("replan-")
    assert (applied.applied, applied.image_id, applied.step, applied.from_node, applied.node) == (
        True, "img-7", 120, "n-was", "n-next")
    layout = applied.applied_layout
    assert layout is not None and layout["layers_per_stage"] == applied.layers_per_stage == shown.layers_per_stage
    assert layout["from_epoch"] == epoch and layout["device_speeds"][3] < 1 and (layout["tp"], layout["pp"]) == (2, 2)
    # Durable: what the allocator passes at the next launch (ROTA_LAYOUT) is that layout.
    stored = db.run(lambda s: read_models.applied_layout(s, job_id))
    assert json.loads(stored) == layout
    # Once the job is queued again (the migration's resume), its next placement's launch carries it.
    assert db.run(lambda s: job_starts.yield_lease(s, job_id, "migrating", Events())) is not None
    node = node_with(db, 4)
    launch = db.run(lambda s: SchedulingLoop._commit_start(s, Start(job_id, node, (0, 1, 2, 3)), Events()))
    assert launch is not None and layout_text(launch) == stored and json.loads(layout_text(launch))["from_epoch"] == epoch


def test_a_retry_with_the_same_operation_id_migrates_once_and_answers_the_first_layout(
    server: Server, db: Database, client: Client,
) -> None:
    job_id, _, _ = slow_job(server, db, accepts_layout_changes=True)
    first = client.replan(job_id=job_id, apply=True, operation_id="op-retry-1")
    stored = db.run(lambda s: read_models.applied_layout(s, job_id))
    # The job moved on (a new placement with no verdicts): a fresh plan would differ, a retry may not.
    assert db.run(lambda s: job_starts.yield_lease(s, job_id, "migrating", Events())) is not None
    again = client.replan(job_id=job_id, apply=True, operation_id="op-retry-1")
    assert [c.operation_id for c in server.checkpoint.calls] == ["op-retry-1", "op-retry-1"]  # the service dedups
    assert again.applied_layout == first.applied_layout and again.layers_per_stage == first.layers_per_stage
    assert db.run(lambda s: read_models.applied_layout(s, job_id)) == stored


def test_a_job_that_does_not_accept_layout_changes_is_refused_naming_the_flag(
    server: Server, db: Database, client: Client,
) -> None:
    job_id, _, _ = slow_job(server, db)
    with pytest.raises(FailedPreconditionError, match="accepts_layout_changes"):
        client.replan(job_id=job_id, apply=True)
    assert server.checkpoint.calls == []
    assert db.run(lambda s: read_models.applied_layout(s, job_id)) == ""
    assert client.replan(job_id=job_id).throughput_after > 0  # showing the plan is still fine


def test_a_refused_migration_undoes_the_stored_layout_and_an_unfinished_one_keeps_it(
    server: Server, db: Database, client: Client,
) -> None:
    job_id, _, _ = slow_job(server, db, accepts_layout_changes=True)
    server.checkpoint.fail = MigrateFailed(FailedPrecondition("the job does not register its state"), definite=True)
    with pytest.raises(FailedPreconditionError, match="register its state"):
        client.replan(job_id=job_id, apply=True)
    assert db.run(lambda s: read_models.applied_layout(s, job_id)) == ""
    # A deadline: the durable migration may still go on, so its layout must be there for it.
    server.checkpoint.fail = MigrateFailed(MigrationGoesOn("still pausing"), definite=False)
    with pytest.raises(DeadlineExceededError):
        client.replan(job_id=job_id, apply=True)
    assert db.run(lambda s: read_models.applied_layout(s, job_id)) != ""


def test_apply_refuses_what_it_cannot_do(server: Server, db: Database, client: Client) -> None:
    owner, _ = tenant(db)
    job_id, _, _ = running_job(db, owner, accepts_layout_changes=True)
    with pytest.raises(InvalidArgumentError) as err:
        client.replan(tp=2, pp=2, dp=1, speeds=[1, 1, 1, 0.5], apply=True)
    assert err.value.field == "job_id"
    with grpc.insecure_channel(server.endpoint) as channel, pytest.raises(grpc.RpcError) as rpc:
        detector_pb2_grpc.DetectorServiceStub(channel).Replan(
            detector_pb2.ReplanRequest(job_id=job_id, apply=True, wait_seconds=math.nan), metadata=META, timeout=10)
    assert dict(rpc.value.trailing_metadata())["rota-field"] == "wait_seconds"  # type: ignore[attr-defined]
    db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "done", Events()))
    with pytest.raises(FailedPreconditionError, match="only a running job"):
        client.replan(job_id=job_id, apply=True)
    assert server.checkpoint.calls == []


# 2. Devices out of the plan.
def test_a_dead_ranks_gpu_leaves_the_plan_until_an_admin_clears_it(server: Server, db: Database, client: Client) -> None:
    owner, token = tenant(db)
    job_id, node, epoch = running_job(db, owner, gpus=4, restart="on-failure", max_retries=2)
    monitor = server.service.monitor
    for rank in (0, 1, 2):
        monitor.beat((job_id, epoch, rank), server.clock[0], 1.0)
    server.clock[0] += 2.0
    monitor.beat((job_id, epoch, 0), server.clock[0], 1.0)
    monitor.beat((job_id, epoch, 2), server.clock[0], 1.0)
    server.clock[0] += 2.0  # rank 1: 4 s of silence > 3 x 1 s
    assert [s.source for s in server.run(server.service.check_silence())] == [(job_id, epoch, 1)]
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == jobstate.PENDING
    # Rank 0 goes quiet a moment later, found in the next check: it went down with the job.
    monitor.end((job_id, epoch, 2))  # rank 2 said goodbye: stopped, not dead
    server.clock[0] += 1.5
    assert [s.source for s in server.run(server.service.check_silence())] == [(job_id, epoch, 0)]

    # The allocator sees GPUs 0 and 1 as bad: the requeued 4-GPU job cannot go back to that
    # node, and a 2-GPU job there gets GPUs 2 and 3.
    view = db.run(planner_view.live_view)
    [live] = [n for n in view.nodes if n.name == node]
    assert live.bad_gpus == (0, 1)
    horizon = Horizon(60.0, 8, 60.0 * 1000)
    out = plan_live([live], [j for j in view.jobs if j.id == job_id], horizon, "fast")
    assert out.decision.starts == [] and "marked bad" in out.decision.waiting[job_id]
    half = replace(next(j for j in view.jobs if j.id == job_id), gpus=2)
    assert plan_live([live], [half], horizon, "fast").decision.starts == [Start(job_id, node, (2, 3))]

    assert [(d.node, d.gpu, d.state, d.job_id, d.rank, d.kind) for d in client.devices() if d.node == node] == [
        (node, 0, "BAD", job_id, 0, "stop"), (node, 1, "BAD", job_id, 1, "stop")]
    assert all("missed heartbeats" in d.reason for d in client.devices() if d.node == node)
    _, other = tenant(db)
    with Client.connect(server.endpoint, token=token, timeout=timedelta(seconds=20)) as own:
        assert {d.job_id for d in own.devices() if d.node == node} == {job_id}
    with Client.connect(server.endpoint, token=other, timeout=timedelta(seconds=20)) as stranger:
        assert [(d.device, d.job_id) for d in stranger.devices() if d.node == node] == [
            (f"{node}:0", ""), (f"{node}:1", "")]  # whose job it was stays hidden
        with pytest.raises(PermissionDeniedError):
            stranger.clear_devices(node)

    # Clearing: all or nothing, only what is bad, then the GPU is planned again.
    with pytest.raises(NotFoundError, match="GPU 2"):
        client.clear_devices(node, [1, 2])
    with pytest.raises(NotFoundError):
        client.clear_devices("no-such-node")
    [cleared] = client.clear_devices(node, [1], reason="reseated")
    assert (cleared.gpu, cleared.state) == (1, "CLEARED") and cleared.cleared is not None
    assert [d.gpu for d in client.devices() if d.node == node] == [0]
    assert [d.state for d in client.devices(include_cleared=True) if d.node == node] == ["BAD", "CLEARED"]
    [live] = [n for n in db.run(planner_view.live_view).nodes if n.name == node]
    assert live.bad_gpus == (0,)
    assert [d.gpu for d in client.clear_devices(node)] == [0]


def test_ranks_silent_after_their_job_ended_otherwise_leave_their_gpus_in_the_plan(
    server: Server, db: Database, client: Client,
) -> None:
    owner, _ = tenant(db)
    job_id, node, epoch = running_job(db, owner, gpus=2)
    for rank in (0, 1):
        server.service.monitor.beat((job_id, epoch, rank), server.clock[0], 1.0)
    db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "done", Events()))  # a race: its streams outlive it a moment
    server.clock[0] += 4.0
    assert len(server.run(server.service.check_silence())) == 2
    assert [v.kind for v in client.verdicts(job_id=job_id)] == ["stop", "stop"]
    assert [d for d in client.devices() if d.node == node] == []


def test_a_device_slow_beyond_repair_leaves_the_plan_and_a_mild_slowdown_does_not(
    server: Server, db: Database, client: Client,
) -> None:
    _, mild_node, _ = slow_job(server, db, factor=1.3)
    _, node, _ = slow_job(server, db, factor=2.5)
    bad = {(d.node, d.gpu): d for d in client.devices()}
    assert (node, 3) in bad and not any(n == mild_node for n, _ in bad)
    assert bad[(node, 3)].kind == "slow" and "beyond repair" in bad[(node, 3)].reason
    # A second verdict on a device already out of the plan keeps the first reason and time.
    before = bad[(node, 3)]
    db.run(lambda s: detector_repo.mark_device(s, DeviceMark(node, 3, "later", "x", 0, "stop")))
    [after] = [d for d in client.devices() if (d.node, d.gpu) == (node, 3)]
    assert (after.reason, after.since) == (before.reason, before.since)
    client.clear_devices(node)
