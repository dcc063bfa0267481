"""DetectorService: heartbeat streams, iteration reports, verdicts, re-plans, drains and devices.

Each job gets one normalised fail-slow detector in memory, fed by its reports in order
(a new placement epoch or layout starts a fresh one, which warms up again). Rank heartbeat
streams feed one monitor; a watcher task turns silence into `stop` verdicts and hands the
job to its restart policy. Verdicts are committed to Postgres before anyone is told, in
the same transaction as the mark that takes their device out of the plan (a dead rank's
GPU, or one slow beyond repair). An applied re-plan is stored first, then executed by the
checkpoint service's Migrate: the job restarts from its image with ROTA_LAYOUT set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
from sqlalchemy.orm import Session

from rota.cluster import node_lifecycle
from rota.cluster.job_lifecycle import Events
from rota.common import convert
from rota.common.auth import Identity, current_identity
from rota.common.db import Database
from rota.common.layouts import replanned_layout_to_proto
from rota.common.live import LiveState
from rota.core.detection.devices import BEYOND_REPAIR_RATIO, check_beyond_repair, mark_for
from rota.core.detection.failslow import JOB, SLOW, STOP, DetectorConfig, FailSlowDetector, Verdict
from rota.core.detection.failstop import HeartbeatMonitor, Silent
from rota.core.detection.layout import IterationReport, Layout, unflatten
from rota.core.detection.replan import Replan, layout_document, replan, require_accepts
from rota.core.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from rota.detector import repository
from rota.detector.applier import CheckpointPort, MigrateFailed
from rota.detector.models import DeviceHealthRow, VerdictRow
from rota.v1 import checkpoint_pb2, detector_pb2, detector_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_LIMIT = 1000
JOB_IDLE_S = 3600.0  # a job's detector is dropped after this long without a report (it warms up again)
DEFAULT_LAYERS = 32
DEFAULT_MICROBATCHES = 8
MAX_REMEMBERED_LOSSES = 10_000
MAX_WAIT_S = 600.0  # an applied re-plan waits at most this long for the restart's placement
MAX_OPERATION_ID = 128
APPLY_MARGIN_S = 1.0  # the migrate call ends this long before the caller's deadline
APPLY_DEFAULT_S = 60.0  # the migrate call's deadline (plus the wait) when the caller set none
RankKey = tuple[str, int, int]  # (job id, epoch, rank)


@dataclass
class JobWatch:
    epoch: int
    detector: FailSlowDetector
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    microbatches: int = DEFAULT_MICROBATCHES
    seen: float = 0.0  # the service clock at its last report


def layout_from_proto(msg: detector_pb2.Layout) -> Layout:
    return Layout(msg.tp, msg.pp, msg.dp, tuple(msg.stage_of_rank))


def layout_to_proto(layout: Layout) -> detector_pb2.Layout:
    return detector_pb2.Layout(tp=layout.tp, pp=layout.pp, dp=layout.dp, stage_of_rank=list(layout.stages))


def verdict_to_proto(row: VerdictRow) -> detector_pb2.Verdict:
    return detector_pb2.Verdict(
        subject=f"job/{row.job_id}/rank/{row.rank}", ratio=row.ratio, evidence=json.dumps(row.evidence),
        verdict_kind=convert.enum_value(detector_pb2.VerdictKind, "VERDICT_KIND_", row.kind),
        job_id=row.job_id, rank=row.rank, iteration=row.iteration, node=row.node or "",
        gpu=row.gpu if row.gpu is not None else -1, epoch=row.epoch,
        at_unix=row.created_at.timestamp() if row.created_at else 0.0,
    )


def device_to_proto(row: DeviceHealthRow, identity: Identity, tenants: dict[str, str]) -> detector_pb2.DeviceHealth:
    """A tenant sees every device's state and reason, but only its own jobs' ids."""
    owner = tenants.get(row.job_id or "")
    return detector_pb2.DeviceHealth(
        node=row.node, gpu=row.gpu_index, reason=row.reason,
        device_state=convert.enum_value(detector_pb2.DeviceState, "DEVICE_STATE_", row.state),
        verdict_kind=convert.enum_value(detector_pb2.VerdictKind, "VERDICT_KIND_", row.kind),
        job_id=row.job_id or "" if owner is not None and identity.may_access(owner) else "",
        rank=row.rank if row.rank is not None else -1,
        since_unix=row.since.timestamp() if row.since else 0.0,
        cleared_unix=row.cleared_at.timestamp() if row.cleared_at else 0.0,
    )


def replan_to_proto(plan: Replan, speeds: list[float]) -> detector_pb2.ReplanResponse:
    return detector_pb2.ReplanResponse(
        layout=layout_to_proto(plan.layout), layers_per_stage=plan.layers_per_stage,
        throughput_before=plan.throughput_before, throughput_after=plan.throughput_after,
        throughput_drop_group=plan.throughput_drop_group,
        stages=[detector_pb2.StagePlan(replica=s.replica, stage=s.stage, ranks=list(s.ranks), layers=s.layers, speed=s.speed)
                for s in plan.stages],
        microbatches_per_replica=list(plan.microbatches), idle_ranks=list(plan.idle), device_speeds=speeds,
    )


def document_to_proto(doc: dict[str, Any]) -> detector_pb2.ReplanResponse:
    """The answer to a retried apply, from the layout stored by the first call."""
    return detector_pb2.ReplanResponse(
        layout=detector_pb2.Layout(tp=int(doc["tp"]), pp=int(doc["pp"]), dp=int(doc["dp"])),
        layers_per_stage=[int(n) for n in doc["layers_per_stage"]],
        throughput_before=float(doc["throughput_before"]), throughput_after=float(doc["throughput_after"]),
        throughput_drop_group=float(doc["throughput_drop_group"]),
        stages=[detector_pb2.StagePlan(replica=int(s["replica"]), stage=int(s["stage"]), ranks=[int(r) for r in s["ranks"]],
                                       layers=int(s["layers"]), speed=float(s["speed"])) for s in doc["stages"]],
        microbatches_per_replica=[int(n) for n in doc["microbatches_per_replica"]],
        idle_ranks=[int(r) for r in doc["idle_ranks"]], device_speeds=[float(v) for v in doc["device_speeds"]],
    )


def report_from_proto(request: detector_pb2.ReportIterationRequest) -> IterationReport:
    if not request.HasField("layout"):
        raise InvalidArgument("layout", "is required (tp, pp, dp)")
    layout = layout_from_proto(request.layout)
    seconds = tuple(None if s < 0 else s for s in request.rank_seconds)
    if any(s is not None and not math.isfinite(s) for s in seconds):
        raise InvalidArgument("rank_seconds", "a time is not a finite number")
    micro = unflatten(list(request.sequence_lengths), list(request.sequences_per_micro_batch), layout.dp)
    return IterationReport(request.iteration, layout, seconds, micro, request.iteration_seconds,
                           request.predicted_iteration_seconds)


class DetectorService(detector_pb2_grpc.DetectorServiceServicer):
    def __init__(
        self, db: Database, live: LiveState | None = None, *, config: DetectorConfig | None = None,
        heartbeat_interval_s: float = 1.0, now: Callable[[], float] = time.time,
        checkpoint: CheckpointPort | None = None, beyond_repair: float = BEYOND_REPAIR_RATIO,
    ) -> None:
        self.db = db
        self.live = live
        self.config = config or DetectorConfig()
        self.now = now
        self.checkpoint = checkpoint  # None: re-plans can be shown but not applied
        self.beyond_repair = check_beyond_repair(beyond_repair)
        self.monitor = HeartbeatMonitor(default_interval_s=heartbeat_interval_s)
        self.jobs: dict[str, JobWatch] = {}
        # Placements their ranks' silence ended (newest last): a rank of one found silent a
        # moment later, in another check, went down with the others.
        self.lost_to_silence: dict[tuple[str, int], None] = {}

    async def tx(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.db.run, fn)

    async def _visible(self, job_id: str, identity: Identity) -> repository.Placement:
        repository.check_name("job_id", job_id, 32)
        where = await self.tx(lambda s: repository.placement(s, job_id))
        if where is None or not identity.may_access(where.tenant):  # another tenant's job reads as missing
            raise NotFound(f"job {job_id} not found")
        return where

    # Heartbeats.
    async def Heartbeat(self, request_iterator: AsyncIterator[detector_pb2.HeartbeatRequest],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[detector_pb2.HeartbeatResponse]:
        identity = current_identity()
        known: set[RankKey] = set()
        try:
            async for beat in request_iterator:
                if not beat.job_id:
                    raise InvalidArgument("job_id", "a heartbeat stream is a job rank's (nodes beat to the api)")
                if not beat.interval_seconds >= 0 or not math.isfinite(beat.interval_seconds):
                    raise InvalidArgument("interval_seconds", "must be a finite number of at least 0")
                key = (beat.job_id, beat.epoch, beat.rank)
                if key not in known:
                    key = await self._rank_source(beat, identity)
                    known.add(key)
                self.monitor.beat(key, self.now(), beat.interval_seconds or None)
                yield detector_pb2.HeartbeatResponse(sequence=beat.sequence)
        finally:
            for key in known:  # the stream ended: its ranks said goodbye (or their agent went away)
                self.monitor.end(key)

    async def _rank_source(self, beat: detector_pb2.HeartbeatRequest, identity: Identity) -> RankKey:
        where = await self._visible(beat.job_id, identity)
        epoch = beat.epoch or where.epoch
        if epoch != where.epoch or not where.holding:
            raise FailedPrecondition(f"job {beat.job_id} does not run under epoch {epoch} (now {where.state}, "
                                     f"epoch {where.epoch}): stop this copy")
        if beat.rank < 0:
            raise InvalidArgument("rank", f"must be at least 0 (got {beat.rank})")
        return beat.job_id, epoch, beat.rank

    async def watch_forever(self, period_s: float | None = None) -> None:
        """Turns silence into verdicts; runs beside the server."""
        while True:
            try:
                await self.check_silence()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one failure
                log.exception("silence check failed")
            await asyncio.sleep(period_s or self.monitor.default_interval_s / 2)

    async def check_silence(self) -> list[Silent]:
        now = self.now()
        for job_id in [j for j, w in self.jobs.items() if now - w.seen > JOB_IDLE_S]:  # finished or gone
            del self.jobs[job_id]
        silent = self.monitor.expired(now)
        by_placement: dict[tuple[str, int], list[Silent]] = {}
        for s in silent:
            job_id, epoch, _ = _rank_key(s)
            by_placement.setdefault((job_id, epoch), []).append(s)
        for (job_id, epoch), ranks in by_placement.items():
            await self._ranks_silent(job_id, epoch, sorted(ranks, key=lambda s: _rank_key(s)[2]))
        return silent

    async def _ranks_silent(self, job_id: str, epoch: int, silent: list[Silent]) -> None:
        """Ranks of one placement found silent: a stop verdict each, and the job to its
        restart policy. Their GPUs leave the plan only when silence is what ended the
        placement: ranks that go quiet after it ended otherwise (stopped, paused, finished)
        are history, not evidence against their devices."""
        watch = self.jobs.get(job_id)
        iteration = watch.detector.last_iteration if watch is not None and watch.epoch == epoch else -1
        verdicts: list[Verdict] = []
        for s in silent:
            rank = _rank_key(s)[2]
            why = f"rank {rank} missed heartbeats for {s.silent_s:.1f}s (timeout {s.timeout_s:g}s)"
            verdicts.append(Verdict(rank, STOP, iteration, s.silent_s / s.timeout_s, {
                "silent_s": round(s.silent_s, 3), "timeout_s": s.timeout_s, "last_beat_unix": s.last_beat, "why": why,
            }))
        why = str(verdicts[0].evidence["why"]) + (f" (and {len(verdicts) - 1} more ranks)" if len(verdicts) > 1 else "")
        events = Events()

        def record(session: Session) -> bool:
            where = repository.placement(session, job_id, epoch)
            if where is None:
                return False
            rows = [(row, v) for v in verdicts if (row := repository.record_verdict(session, where, epoch, v, {}))]
            handled = repository.rank_lost(session, job_id, epoch, why, events)
            if handled or (job_id, epoch) in self.lost_to_silence:
                for row, v in rows:  # new verdicts only: a device cleared since stays cleared
                    self._mark_device(session, row, v)
            return handled

        handled = await self.tx(record)
        if handled:
            self.lost_to_silence[(job_id, epoch)] = None
            while len(self.lost_to_silence) > MAX_REMEMBERED_LOSSES:
                del self.lost_to_silence[next(iter(self.lost_to_silence))]
        log.warning("job %s: %s%s", job_id, why, "; handed to its restart policy" if handled else "")
        await self._publish(events)

    def _mark_device(self, session: Session, row: VerdictRow, verdict: Verdict) -> None:
        """Takes the verdict's device out of the plan when it calls for that (rota.core.detection.devices)."""
        mark = mark_for(verdict, row.job_id, row.node, row.gpu, self.beyond_repair)
        if mark is not None and repository.mark_device(session, mark):
            log.warning("device %s/%d is out of the plan until cleared: %s", mark.node, mark.gpu, mark.reason)

    async def _publish(self, events: Events) -> None:
        if self.live is None or not events.items:
            return
        try:
            await asyncio.to_thread(self.live.publish_job_events, events.items)
        except Exception as exc:  # noqa: BLE001 - Redis is a cache; Postgres has the change
            log.warning("could not publish %d job events: %s", len(events.items), exc)

    # Iteration reports.
    async def ReportIteration(self, request: detector_pb2.ReportIterationRequest,
                              context: grpc.aio.ServicerContext) -> detector_pb2.ReportIterationResponse:
        identity = current_identity()
        where = await self._visible(request.job_id, identity)
        epoch = request.epoch or where.epoch
        if epoch != where.epoch:
            raise FailedPrecondition(f"job {request.job_id} runs under epoch {where.epoch}, not {epoch}")
        report = report_from_proto(request)
        watch = self.jobs.get(where.job_id)
        if watch is None or watch.epoch != epoch or watch.detector.layout != report.layout:
            watch = self.jobs[where.job_id] = JobWatch(epoch, FailSlowDetector(report.layout, self.config), seen=self.now())
        async with watch.lock:
            watch.microbatches, watch.seen = len(report.micro_batches[0]), self.now()
            found = await asyncio.to_thread(watch.detector.observe, report)
            if not found:
                return detector_pb2.ReportIterationResponse()
            extra = {"layout": {**report.layout.as_dict(), "stages": list(report.layout.stages)},
                     "microbatches": watch.microbatches}

            def record(session: Session) -> list[VerdictRow]:
                rows = []
                for v in found:
                    row = repository.record_verdict(session, where, epoch, v, extra)
                    if row is not None:
                        self._mark_device(session, row, v)
                        rows.append(row)
                return rows

            rows = await self.tx(record)
        for v in found:
            log.warning("job %s: rank %d %s at iteration %d (ratio %.3f)", where.job_id, v.rank, v.kind, v.iteration, v.ratio)
        return detector_pb2.ReportIterationResponse(verdicts=[verdict_to_proto(r) for r in rows])

    # Reading verdicts.
    async def Verdicts(self, request: detector_pb2.VerdictsRequest,
                       context: grpc.aio.ServicerContext) -> detector_pb2.VerdictsResponse:
        identity = current_identity()
        limit = request.limit or 100
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument("limit", f"must be 1..{MAX_LIMIT} (got {limit})")
        if request.job_id:
            await self._visible(request.job_id, identity)
        tenant = "" if identity.is_admin else identity.tenant
        rows = await self.tx(lambda s: repository.verdicts(s, job_id=request.job_id, tenant=tenant, limit=limit))
        return detector_pb2.VerdictsResponse(verdicts=[verdict_to_proto(r) for r in rows])

    # Re-plans.
    async def Replan(self, request: detector_pb2.ReplanRequest, context: grpc.aio.ServicerContext) -> detector_pb2.ReplanResponse:
        identity = current_identity()
        layers = request.layers or DEFAULT_LAYERS
        microbatches = request.microbatches or DEFAULT_MICROBATCHES
        speeds = list(request.device_speeds)
        layout = layout_from_proto(request.layout) if request.HasField("layout") else None
        if request.apply:
            _check_apply(request)
        where: repository.Placement | None = None
        if request.job_id:
            where = await self._visible(request.job_id, identity)
            if request.apply:
                # Refused before any work: the flag is the job author's promise to read ROTA_LAYOUT.
                require_accepts(where.job_id, where.accepts_layout_changes)
                job_id = where.job_id
                stored = await self.tx(lambda s: repository.layout_of(s, job_id))
                if request.operation_id and stored is not None and stored.operation_id == request.operation_id:
                    return await self._apply(where, stored, request, context, document_to_proto(stored.layout), retry=True)
                if not where.holding:
                    raise FailedPrecondition(f"job {where.job_id} is {where.state}: only a running job can be "
                                             "restarted with a new layout")
            layout, speeds, microbatches = await self._job_replan_inputs(where, request, layout, speeds, microbatches)
        if layout is None:
            raise InvalidArgument("layout", "is required (or give job_id of a job that reported iterations)")
        if not speeds:
            raise InvalidArgument("device_speeds", "give one speed per rank (1 nominal, 0 dead), or a job_id")
        plan = await asyncio.to_thread(replan, layout, speeds, layers=layers, microbatches=microbatches)
        response = replan_to_proto(plan, speeds)
        if not request.apply or where is None:
            return response
        doc = layout_document(plan, layers=layers, microbatches=microbatches, speeds=speeds, from_epoch=where.epoch)
        stored = repository.StoredLayout(doc, where.epoch, request.operation_id or f"replan-{uuid.uuid4()}")
        return await self._apply(where, stored, request, context, response, retry=False)

    async def _apply(
        self, where: repository.Placement, stored: repository.StoredLayout, request: detector_pb2.ReplanRequest,
        context: grpc.aio.ServicerContext, response: detector_pb2.ReplanResponse, *, retry: bool,
    ) -> detector_pb2.ReplanResponse:
        """Stores the layout (durably, first: the restart's launch reads it), then has the
        checkpoint service migrate the job; undoes the store when the migration surely failed."""
        if self.checkpoint is None:
            raise Unavailable("this detector has no checkpoint service to restart jobs through (ROTA_CHECKPOINT_ADDR)")
        previous = None if retry else await self.tx(lambda s: repository.store_layout(s, where.job_id, stored))
        remaining = context.time_remaining()
        timeout = remaining - APPLY_MARGIN_S if remaining is not None else APPLY_DEFAULT_S + request.wait_seconds
        migrate = checkpoint_pb2.MigrateRequest(job_id=where.job_id, operation_id=stored.operation_id,
                                                wait_seconds=request.wait_seconds)
        try:
            reply = await self.checkpoint.migrate(migrate, max(1.0, timeout))
        except MigrateFailed as exc:
            if exc.definite and not retry:
                await self.tx(lambda s: repository.restore_layout(s, where.job_id, stored, previous))
            raise exc.error from exc
        log.info("job %s: re-plan applied (%s); restarts from image %s at step %d%s", where.job_id, stored.operation_id,
                 reply.image_id, reply.step, f" on {reply.node}" if reply.node else "")
        response.applied = True
        response.replanned_layout.CopyFrom(replanned_layout_to_proto(stored.layout))
        response.image_id, response.step, response.from_node, response.node = (
            reply.image_id, reply.step, reply.from_node, reply.node)
        return response

    async def _job_replan_inputs(
        self, where: repository.Placement, request: detector_pb2.ReplanRequest, layout: Layout | None,
        speeds: list[float], microbatches: int,
    ) -> tuple[Layout | None, list[float], int]:
        """The job's layout (from its reports) and speeds (from its verdicts of the current epoch)."""
        rows = await self.tx(lambda s: repository.verdicts(s, job_id=where.job_id, limit=MAX_LIMIT))
        rows = [r for r in rows if r.epoch == where.epoch and r.rank != JOB]
        watch = self.jobs.get(where.job_id)
        if layout is None and watch is not None and watch.epoch == where.epoch:
            layout, microbatches = watch.detector.layout, request.microbatches or watch.microbatches
        if layout is None and rows and "layout" in rows[0].evidence:
            saved: dict[str, Any] = rows[0].evidence["layout"]
            layout = Layout(int(saved["tp"]), int(saved["pp"]), int(saved["dp"]), tuple(saved.get("stages") or ()))
            microbatches = request.microbatches or int(rows[0].evidence.get("microbatches") or microbatches)
        if layout is not None and not speeds:
            speeds = [1.0] * layout.ranks
            for r in rows:
                if 0 <= r.rank < layout.ranks:
                    speeds[r.rank] = 0.0 if r.kind == STOP else min(speeds[r.rank], 1 / r.ratio if r.kind == SLOW and r.ratio > 0 else 1.0)
        return layout, speeds, microbatches

    # Draining.
    async def Drain(self, request: detector_pb2.DrainRequest, context: grpc.aio.ServicerContext) -> detector_pb2.DrainResponse:
        current_identity().require_admin()
        repository.check_name("node", request.node, 64)
        health, running = await self.tx(lambda s: node_lifecycle.drain(s, request.node, undo=request.undo))
        log.info("node %s is %s (%d jobs still running there)%s", request.node, health, running,
                 f": {request.reason}" if request.reason else "")
        return detector_pb2.DrainResponse(node=request.node, running_jobs=running,
                                          node_health=convert.health_value(health))

    # Devices out of the plan.
    async def Devices(self, request: detector_pb2.DevicesRequest, context: grpc.aio.ServicerContext) -> detector_pb2.DevicesResponse:
        identity = current_identity()

        def read(session: Session) -> tuple[list[DeviceHealthRow], dict[str, str]]:
            rows = list(repository.devices(session, include_cleared=request.include_cleared))
            return rows, repository.tenants_of(session, {r.job_id for r in rows if r.job_id})

        rows, tenants = await self.tx(read)
        return detector_pb2.DevicesResponse(devices=[device_to_proto(r, identity, tenants) for r in rows])

    async def ClearDevices(self, request: detector_pb2.ClearDevicesRequest,
                           context: grpc.aio.ServicerContext) -> detector_pb2.ClearDevicesResponse:
        identity = current_identity()
        identity.require_admin()

        def clear(session: Session) -> tuple[list[DeviceHealthRow], dict[str, str]]:
            rows = repository.clear_devices(session, request.node, list(request.gpus))
            return rows, repository.tenants_of(session, {r.job_id for r in rows if r.job_id})

        rows, tenants = await self.tx(clear)
        for r in rows:
            log.info("device %s/%d is back in the plan%s", r.node, r.gpu_index, f": {request.reason}" if request.reason else "")
        return detector_pb2.ClearDevicesResponse(cleared=[device_to_proto(r, identity, tenants) for r in rows])


def _rank_key(s: Silent) -> RankKey:
    return cast(RankKey, s.source)  # the monitor is fed rank keys only (Heartbeat)


def _check_apply(request: detector_pb2.ReplanRequest) -> None:
    if not request.job_id:
        raise InvalidArgument("job_id", "apply restarts a job with the new layout: give the job's id")
    if not 0 <= request.wait_seconds <= MAX_WAIT_S:  # `not <=` also refuses NaN
        raise InvalidArgument("wait_seconds", f"must be 0..{MAX_WAIT_S:g} seconds (got {request.wait_seconds})")
    op = request.operation_id
    if len(op) > MAX_OPERATION_ID or any(ord(c) < 32 for c in op):
        raise InvalidArgument("operation_id", f"at most {MAX_OPERATION_ID} printable characters")
