"""DetectorService over gRPC on a real PostgreSQL: reports to verdicts, silent ranks, re-plans.

The server runs in-process with the real interceptor (tokens, errors to status codes) on a
loopback port; the SDK and raw stubs drive it. The service's clock is the test's, so a
rank's silence is a clock step, not a sleep.
"""

from __future__ import annotations

import asyncio
import queue
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc
import pytest
from detector_fixtures import report_requests, running_job, tenant
from opentelemetry import trace

from rota.client import Client, InvalidArgumentError, NotFoundError, PermissionDeniedError
from rota.cluster.job_lifecycle import get_job, history
from rota.common.bootstrap import TokenAuthenticator
from rota.common.db import Database
from rota.common.server import RotaInterceptor
from rota.core import jobstate
from rota.core.detection.failslow import DetectorConfig
from rota.detector.service import DetectorService
from rota.v1 import detector_pb2, detector_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)
CONFIG = DetectorConfig(threshold=1.1, consecutive=5, warmup=20)


@dataclass
class Server:
    endpoint: str
    service: DetectorService
    loop: asyncio.AbstractEventLoop
    clock: list[float]

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
    service = DetectorService(db, None, config=CONFIG, heartbeat_interval_s=1.0, now=lambda: clock[0])

    async def start() -> tuple[grpc.aio.Server, int]:
        interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db),
                                      default_deadline_s=20)
        srv = grpc.aio.server(interceptors=[interceptor])
        detector_pb2_grpc.add_DetectorServiceServicer_to_server(service, srv)
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        return srv, port

    srv, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    yield Server(f"127.0.0.1:{port}", service, loop, clock)
    asyncio.run_coroutine_threadsafe(srv.stop(0), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client.connect(server.endpoint, token=ADMIN, timeout=timedelta(seconds=20)) as c:
        yield c


def stub(server: Server) -> tuple[detector_pb2_grpc.DetectorServiceStub, grpc.Channel]:
    channel = grpc.insecure_channel(server.endpoint)
    return detector_pb2_grpc.DetectorServiceStub(channel), channel


META = (("authorization", f"Bearer {ADMIN}"),)


def test_reports_with_a_slow_rank_become_a_durable_verdict_with_evidence(server: Server, db: Database, client: Client) -> None:
    owner, token = tenant(db)
    job_id, node, epoch = running_job(db, owner)
    detector, channel = stub(server)
    found = []
    with channel:
        for request in report_requests(job_id, epoch, [{"kind": "slow", "rank": 3, "factor": 1.25, "from_iter": 60}], 100):
            found += list(detector.ReportIteration(request, metadata=META).verdicts)
    assert [(v.rank, v.verdict_kind, v.iteration) for v in found] == [
        (3, detector_pb2.VERDICT_KIND_SLOW, 60 + CONFIG.consecutive - 1)]
    # Durable: a fresh read from Postgres, through the SDK, with where it ran and why.
    [verdict] = client.verdicts(job_id=job_id)
    assert (verdict.rank, verdict.kind, verdict.node, verdict.gpu, verdict.epoch) == (3, "slow", node, 3, epoch)
    assert verdict.ratio == pytest.approx(1.25, rel=0.03)
    assert verdict.evidence["stage"] == 1 and verdict.evidence["tp_peer_ratios"]["2"] == pytest.approx(1.0, abs=0.05)
    assert verdict.evidence["layout"] == {"tp": 2, "pp": 2, "dp": 1, "stages": []}
    # The job's tenant sees it; another tenant cannot tell the job exists.
    with Client.connect(server.endpoint, token=token, timeout=timedelta(seconds=20)) as own:
        assert [v.rank for v in own.verdicts()] == [3]
    _, other = tenant(db)
    with Client.connect(server.endpoint, token=other, timeout=timedelta(seconds=20)) as stranger:
        with pytest.raises(NotFoundError):
            stranger.verdicts(job_id=job_id)
        assert stranger.verdicts() == []
    # The re-plan from the job's own layout and verdicts gives rank 3's stage fewer layers.
    plan = client.replan(job_id=job_id)
    assert plan.device_speeds[3] == pytest.approx(1 / verdict.ratio) and plan.layout == {"tp": 2, "pp": 2, "dp": 1}
    assert plan.layers_per_stage[0] > plan.layers_per_stage[1]
    assert plan.throughput_before < plan.throughput_after <= 1.0


def test_sequence_length_variation_alone_gives_no_verdict(server: Server, db: Database, client: Client) -> None:
    owner, _ = tenant(db)
    job_id, _, epoch = running_job(db, owner)
    detector, channel = stub(server)
    with channel:
        for request in report_requests(job_id, epoch, [], 150):
            assert not detector.ReportIteration(request, metadata=META).verdicts
    assert client.verdicts(job_id=job_id) == []


@pytest.mark.parametrize(("change", "field"), [
    ({"layout": None}, "layout"),
    ({"rank_seconds": [1.0, 1.0]}, "rank_seconds"),
    ({"sequences_per_micro_batch": [1]}, "sequences_per_micro_batch"),
])
def test_a_bad_report_names_its_field(server: Server, db: Database, change: dict[str, Any], field: str) -> None:
    owner, _ = tenant(db)
    job_id, _, epoch = running_job(db, owner)
    request = report_requests(job_id, epoch, [], 1)[0]
    for key, value in change.items():
        request.ClearField(key)
        if value is not None:
            getattr(request, key).extend(value)
    detector, channel = stub(server)
    with channel, pytest.raises(grpc.RpcError) as err:
        detector.ReportIteration(request, metadata=META)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert dict(err.value.trailing_metadata())["rota-field"] == field  # type: ignore[attr-defined]


class Beats:
    """A rank's heartbeat stream from a test thread: `beat()` sends, `close()` ends it gracefully."""

    def __init__(self, server: Server, job_id: str, epoch: int, rank: int) -> None:
        self.detector, self.channel = stub(server)
        self.requests: queue.Queue[detector_pb2.HeartbeatRequest | None] = queue.Queue()
        self.key = (job_id, epoch, rank)
        self.acks: queue.Queue[int] = queue.Queue()
        self.error: list[grpc.RpcError] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sequence = 0
        self.thread.start()

    def _requests(self) -> Iterator[detector_pb2.HeartbeatRequest]:
        while (item := self.requests.get()) is not None:
            yield item

    def _run(self) -> None:
        try:
            for ack in self.detector.Heartbeat(self._requests(), metadata=META):
                self.acks.put(ack.sequence)
        except grpc.RpcError as exc:
            self.error.append(exc)
            self.acks.put(-1)

    def beat(self) -> int:
        self.sequence += 1
        job_id, epoch, rank = self.key
        self.requests.put(detector_pb2.HeartbeatRequest(job_id=job_id, epoch=epoch, rank=rank, sequence=self.sequence,
                                                        interval_seconds=1.0))
        return self.acks.get(timeout=10)

    def close(self) -> None:
        self.requests.put(None)
        self.thread.join(timeout=10)
        self.channel.close()


def test_a_rank_silent_past_three_intervals_is_a_stop_verdict_and_its_job_is_requeued(
    server: Server, db: Database, client: Client,
) -> None:
    owner, _ = tenant(db)
    job_id, node, epoch = running_job(db, owner, restart="on-failure", max_retries=2)
    beats = [Beats(server, job_id, epoch, r) for r in range(2)]
    try:
        assert [b.beat() for b in beats] == [1, 1]
        server.clock[0] += 2.5
        assert beats[0].beat() == 2  # rank 0 keeps beating; rank 1 has gone quiet
        assert server.run(server.service.check_silence()) == []
        server.clock[0] += 1.0  # rank 1: 3.5 s of silence > 3 x 1 s
        silent = server.run(server.service.check_silence())
        assert [s.source for s in silent] == [(job_id, epoch, 1)]
        job = db.run(lambda s: get_job(s, job_id))
        assert job is not None and job.state == jobstate.PENDING and job.node is None
        states = [(h.from_state, h.to_state) for h in db.run(lambda s: history(s, job_id))]
        assert states[-2:] == [(jobstate.SCHEDULED, jobstate.LOST), (jobstate.LOST, jobstate.PENDING)]
        [verdict] = client.verdicts(job_id=job_id)
        assert (verdict.rank, verdict.kind, verdict.node, verdict.gpu) == (1, "stop", node, 1)
        assert verdict.evidence["silent_s"] == pytest.approx(3.5)
        # The stale copy is told so when it beats on a new stream under the old epoch.
        late = Beats(server, job_id, epoch, 0)
        assert late.beat() == -1 and late.error[0].code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        late.close()
    finally:
        for b in beats:
            b.close()


def test_a_stream_that_ends_is_a_goodbye_not_a_death(server: Server, db: Database, client: Client) -> None:
    owner, _ = tenant(db)
    job_id, _, epoch = running_job(db, owner)
    beats = Beats(server, job_id, epoch, 0)
    assert beats.beat() == 1
    beats.close()
    server.clock[0] += 100.0
    assert server.run(server.service.check_silence()) == []
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == jobstate.SCHEDULED
    assert client.verdicts(job_id=job_id) == []


def test_replan_answers_for_a_given_layout_and_refuses_bad_input(client: Client) -> None:
    plan = client.replan(tp=2, pp=2, dp=2, speeds=[1, 0, 1, 1, 1, 1, 1, 1], layers=16, microbatches=8)
    assert plan.throughput_before == 0.0 and plan.throughput_after > plan.throughput_drop_group > 0
    replica0 = {tuple(s["ranks"]): s["layers"] for s in plan.stages if s["replica"] == 0}
    assert set(replica0) == {(0,), (2, 3)} and replica0[(0,)] < replica0[(2, 3)]  # rank 0 alone: TP 1, fewer layers
    with pytest.raises(InvalidArgumentError) as err:
        client.replan(tp=2, pp=2, dp=2, speeds=[1.0] * 3)
    assert err.value.field == "device_speeds"


def test_drain_is_for_admins_and_names_unknown_nodes(server: Server, db: Database, client: Client) -> None:
    with pytest.raises(NotFoundError):
        client.drain("no-such-node")
    _, token = tenant(db)
    with Client.connect(server.endpoint, token=token, timeout=timedelta(seconds=20)) as t:
        with pytest.raises(PermissionDeniedError):
            t.drain("no-such-node")
