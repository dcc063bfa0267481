"""gRPC adapters of the api: protos in, repository and validation calls, protos out.

Database work runs in worker threads (one transaction each); events go to Redis and
commands to agents only after the commit, never inside a transaction.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc
from sqlalchemy.orm import Session

from rota.api import repository
from rota.api.batcher import SubmitBatcher
from rota.cluster import (
    heartbeats,
    job_arrays,
    job_lifecycle,
    job_protos,
    node_lifecycle,
    queries,
    submissions,
)
from rota.cluster.job_lifecycle import Events, get_job, history, utcnow
from rota.common import convert, read_models
from rota.common.agents import AgentClients
from rota.common.auth import Identity, current_identity, hash_token, new_token
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState
from rota.common.refresh import RefreshAhead
from rota.core import jobstate
from rota.core.arrays import parse_array
from rota.core.errors import FailedPrecondition, InvalidArgument, NotFound
from rota.core.jobspec import JobSpecData, validate
from rota.core.nodelabels import labels_problem, type_problem
from rota.v1 import agent_pb2, api_pb2, api_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_LIST = 500
LARGEST_NODE_TTL_S = 1.0
MAX_UNPUBLISHED = 100_000
# Submitted events go to Redis in pipelines at most this often (one worker thread and one
# round trip each): a pipeline has a fixed cost that one per batch paid every second or
# third submission at 200/s. The first after a quiet spell goes at once (it wakes the allocator).
PUBLISH_GATHER_S = 0.05
MAX_TOKEN_TTL_S = 3650 * 86400  # ten years
# States whose event wakes the allocator: queued again, or GPUs freed.
OTHER_TENANT = "*"  # another tenant's job id, as a tenant sees it (as `rota plan` shows its cells)
WAKE_STATES = frozenset({jobstate.PENDING, jobstate.PAUSED, *jobstate.FINAL_STATES})


class ApiContext:
    """What every api handler needs; built once by main.py."""

    def __init__(self, settings: Settings, db: Database, live: LiveState, agents: AgentClients) -> None:
        self.settings = settings
        self.db = db
        self.live = live
        self.agents = agents
        # Submissions go to the same database as every other call, by their own connections.
        self.submissions = SubmitBatcher(db.engine.url.render_as_string(hide_password=False), self._publish_submitted)
        self._node_shape: RefreshAhead[None, queries.NodeShape] = RefreshAhead(
            lambda _: self.tx(queries.node_shape), LARGEST_NODE_TTL_S)
        self._unpublished: list[tuple[str, str, dict[str, Any]]] = []
        self._publishing: asyncio.Task[None] | None = None
        self._published_at = float("-inf")  # event-loop time of the last pipeline sent

    async def tx(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.db.run, fn)

    async def publish(self, events: Events) -> None:
        """Best effort: Redis is a cache, a failure here loses no state. A job that left
        its GPUs or went back to the queue wakes the allocator: it has work."""
        if not events.items and not events.gpus_freed:
            return
        wake = events.gpus_freed or any(
            event == "state" and snapshot.get("state") in WAKE_STATES for _, event, snapshot in events.items)
        try:
            await asyncio.to_thread(self.live.publish_job_events, events.items, wake=wake)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not publish %d job events: %s", len(events.items), exc)

    async def publish_wake(self) -> None:
        """Wakes the allocator without per-job events (an array's thousands of tasks)."""
        try:
            await asyncio.to_thread(self.live.publish_job_events, [], wake=True)
        except Exception as exc:  # noqa: BLE001 - a cache; the allocator's interval finds them
            log.warning("could not wake the allocator: %s", exc)

    async def node_shape(self, *, refresh: bool = False) -> queries.NodeShape:
        """The largest node's GPUs and the GPU types present, at most a second old: every
        submission is validated against them, and nodes come and go far more rarely than
        jobs arrive."""
        return await self._node_shape.get(None, fresh=refresh)

    def _publish_submitted(self, new: list[tuple[submissions.Submission, submissions.Stored]]) -> None:
        """After a batch commits: its PENDING events go to Redis in the background, one
        pipeline at a time. The answer does not wait for them: Postgres already holds the
        truth, and a watcher re-reads it, so a late (or, with Redis down, lost) event
        costs nothing but a wake-up."""
        self._unpublished += [(stored.job_id, "state", _pending_snapshot(stored.job_id)) for _item, stored in new]
        if len(self._unpublished) > MAX_UNPUBLISHED:  # Redis gone for a while: keep the newest
            dropped = len(self._unpublished) - MAX_UNPUBLISHED
            del self._unpublished[:dropped]
            log.warning("dropped %d unpublished job events (Redis slow or down)", dropped)
        if self._unpublished and (self._publishing is None or self._publishing.done()):
            self._publishing = asyncio.create_task(self._drain_unpublished())

    async def _drain_unpublished(self) -> None:
        loop = asyncio.get_running_loop()
        while self._unpublished:
            # Pipelines go at most every PUBLISH_GATHER_S: under load the batches committed
            # meanwhile share one trip to Redis (and one worker thread); after a quiet spell
            # the first goes at once, and with it the allocator's wake-up.
            await asyncio.sleep(max(0.0, self._published_at + PUBLISH_GATHER_S - loop.time()))
            items, self._unpublished = self._unpublished, []
            self._published_at = loop.time()
            try:
                await asyncio.to_thread(self.live.publish_job_events, items, wake=True)
            except Exception as exc:  # noqa: BLE001 - a cache; Postgres has the jobs
                log.warning("could not publish %d job events: %s", len(items), exc)
                return


def _owned_spec(message: common_pb2.JobSpec, request_id: str) -> JobSpecData:
    """The submitted spec with its tenant: a tenant's token submits for its own tenant only
    (a spec without one is its own); the admin's must name the tenant."""
    spec = convert.spec_from_proto(message)
    spec.tenant = current_identity().tenant_for(spec.tenant)
    if len(request_id) > 128:
        raise InvalidArgument("request_id", "longer than 128 characters")
    return spec


def _array_proto(session: Session, row: queries.JobArray, job_ids: Sequence[str] = ()) -> api_pb2.JobArray:
    counts = job_arrays.state_counts(session, [row.id])[row.id]
    return api_pb2.JobArray(
        id=row.id, tenant=row.tenant, name=row.name, count=row.count, max_running=row.max_running,
        job_ids=list(job_ids), created_at=convert.timestamp(row.created_at),
        states=[api_pb2.StateCount(state=convert.state_value(st), count=n) for st, n in sorted(counts.items())])


def _new_job_proto(stored: submissions.Stored, spec: JobSpecData) -> common_pb2.Job:
    """A just-stored job as job_protos.job_to_proto renders its row."""
    return common_pb2.Job(
        id=stored.job_id, spec=convert.spec_to_proto(spec), state=PENDING_PROTO, reason="submitted",
        progress=convert.struct({}), created_at=convert.timestamp(stored.created_at),
    )


def _pending_snapshot(job_id: str) -> dict[str, Any]:
    """job_lifecycle.job_snapshot of a just-stored job."""
    return {"id": job_id, "state": jobstate.PENDING, "reason": "submitted", "node": None, "gpus": [], "epoch": 0,
            "progress": {}}


def _job_proto(session: Session, job_id: str) -> common_pb2.Job:
    job = get_job(session, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job_protos.job_to_proto(job, history(session, job.id))


def _stops(session: Session, cancelled: Sequence[tuple[queries.Job, list[str]]]) -> list[tuple[str, int, str]]:
    """(job, epoch, agent address) of each node whose agent must stop a cancelled job."""
    nodes = sorted({n for _, held in cancelled for n in held})
    address = queries.node_addresses(session, nodes)
    return [(job.id, job.epoch, address[n]) for job, held in cancelled for n in held if n in address]


def _visible_job(session: Session, job_id: str, identity: Identity) -> queries.Job:
    job = get_job(session, job_id)
    # Another tenant's job reads as missing, so ids cannot be probed.
    if job is None or not identity.may_access(job.tenant):
        raise NotFound(f"job {job_id} not found")
    return job


class JobService(api_pb2_grpc.JobServiceServicer):
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def SubmitJob(self, request: api_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext) -> api_pb2.SubmitJobResponse:
        spec = await self._validated(_owned_spec(request.spec, request.request_id))
        item = submissions.Submission(spec, request.request_id)
        if spec.depends_on:
            # Its parents are read in the transaction that stores it: not the batcher's statement.
            events = Events()
            stored = await self.ctx.tx(lambda s: job_arrays.submit_dependent(s, item, events))
            await self.ctx.publish(events)
        else:
            stored = await self.ctx.submissions.submit(item)
        if stored.created:
            # Every field of a new job is known: nothing to read back, no history yet.
            return api_pb2.SubmitJobResponse(job=_new_job_proto(stored, spec), created=True)
        # A retry of an earlier submission: the job as it stands now.
        return api_pb2.SubmitJobResponse(job=await self.ctx.tx(lambda s: _job_proto(s, stored.job_id)), created=False)

    async def SubmitJobArray(
        self, request: api_pb2.SubmitJobArrayRequest, context: grpc.aio.ServicerContext,
    ) -> api_pb2.SubmitJobArrayResponse:
        spec = _owned_spec(request.spec, request.request_id)
        array = parse_array(request.indices, cap=self.ctx.settings.max_array, max_running=request.max_running)
        item = job_arrays.ArraySubmission(await self._validated(spec), array, request.request_id)
        stored = await self.ctx.tx(lambda s: job_arrays.submit_array(s, item))
        if stored.created:  # one wake-up for the lot; each task's watcher reads Postgres
            await self.ctx.publish_wake()
        message = api_pb2.JobArray(
            id=stored.array_id, tenant=spec.tenant, name=spec.name, count=stored.count, max_running=stored.max_running,
            job_ids=stored.job_ids, created_at=convert.timestamp(stored.created_at))
        return api_pb2.SubmitJobArrayResponse(array=message, created=stored.created)

    async def _validated(self, spec: JobSpecData) -> JobSpecData:
        shape = await self.ctx.node_shape()
        try:
            return validate(spec, max_gpus_per_node=shape.largest_node_gpus,
                            known_gpu_types=shape.gpu_types)
        except InvalidArgument as exc:
            if exc.field not in ("gpus", "gpus_per_node", "gpu_types"):
                raise
        # Too many GPUs or an unknown type for the cached shape: a node may have joined since.
        shape = await self.ctx.node_shape(refresh=True)
        return validate(spec, max_gpus_per_node=shape.largest_node_gpus, known_gpu_types=shape.gpu_types)

    async def GetJob(self, request: api_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> api_pb2.GetJobResponse:
        identity = current_identity()

        def read(session: Session) -> common_pb2.Job:
            job = _visible_job(session, request.id, identity)
            message = job_protos.job_to_proto(job, history(session, job.id))
            message.guests.extend(queries.guests_of(session, job.id, "" if identity.is_admin else identity.tenant))
            return message

        return api_pb2.GetJobResponse(job=await self.ctx.tx(read))

    async def GetJobArray(
        self, request: api_pb2.GetJobArrayRequest, context: grpc.aio.ServicerContext,
    ) -> api_pb2.GetJobArrayResponse:
        identity = current_identity()

        def read(session: Session) -> api_pb2.JobArray:
            row = job_arrays.get_array(session, request.id)
            if row is None or not identity.may_access(row.tenant):  # another tenant's reads as missing
                raise NotFound(f"job array {request.id} not found")
            return _array_proto(session, row, job_arrays.task_ids(session, row.id))

        return api_pb2.GetJobArrayResponse(array=await self.ctx.tx(read))

    async def ListJobs(self, request: api_pb2.ListJobsRequest, context: grpc.aio.ServicerContext) -> api_pb2.ListJobsResponse:
        identity = current_identity()
        tenant = request.tenant if identity.is_admin else identity.tenant
        states = [convert.state_name(s, f"states[{i}]") for i, s in enumerate(request.states)]
        limit = request.limit if 0 < request.limit <= MAX_LIST else MAX_LIST

        def read(session: Session) -> api_pb2.ListJobsResponse:
            jobs = queries.list_jobs(session, tenant, states, limit)
            listed = sorted({j.array_id for j in jobs if j.array_id})  # their arrays, every task counted
            return api_pb2.ListJobsResponse(jobs=[job_protos.job_to_proto(j) for j in jobs],
                                            arrays=[_array_proto(session, a) for a in job_arrays.arrays_of(session, listed)])

        return await self.ctx.tx(read)

    async def CancelJob(self, request: api_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> api_pb2.CancelJobResponse:
        identity = current_identity()
        events = Events()

        def cancel(session: Session) -> tuple[api_pb2.CancelJobResponse, list[tuple[str, int, str]]]:
            row = job_arrays.get_array(session, request.id) if get_job(session, request.id) is None else None
            if row is not None and identity.may_access(row.tenant):  # an array: every unfinished task
                done = job_arrays.cancel_array(session, row.id, request.reason, events)
                session.flush()
                stops = _stops(session, [(job, nodes) for job, nodes in done])
                return api_pb2.CancelJobResponse(array=_array_proto(session, row, [j.id for j, _ in done])), stops
            _visible_job(session, request.id, identity)
            job, nodes = job_lifecycle.cancel_job(session, request.id, request.reason, events)
            reply = api_pb2.CancelJobResponse(job=job_protos.job_to_proto(job, history(session, job.id)))
            return reply, _stops(session, [(job, nodes)])

        reply, stops = await self.ctx.tx(cancel)
        await self.ctx.publish(events)
        for job_id, epoch, address in stops:
            # After the commit: stop the processes now (a gang's on every node); if an agent
            # is unreachable, its next heartbeat's reconciliation stops them.
            try:
                await self.ctx.agents.stub(address).Stop(
                    agent_pb2.StopRequest(job_id=job_id, epoch=epoch, reason="cancelled", grace_seconds=5), timeout=15, metadata=self.ctx.agents.metadata
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("stop of %s at %s failed (%s); reconciliation will stop it", job_id, address, exc.code(),
                            extra={"job_id": job_id})
        return reply

    async def WatchJob(self, request: api_pb2.WatchJobRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[api_pb2.WatchJobResponse]:
        identity = current_identity()

        def read(session: Session) -> common_pb2.Job:
            job = _visible_job(session, request.id, identity)
            return job_protos.job_to_proto(job, history(session, job.id))

        job = await self.ctx.tx(read)
        last_id = await self._last_event_id(request.id)
        yield api_pb2.WatchJobResponse(job=job, event="snapshot")
        last_seen = (job.state, job.progress.SerializeToString(deterministic=True))
        while job.state not in FINAL_PROTO_STATES:
            events, last_id = await self._next_events(request.id, last_id)
            # Redis is only a cache: whatever it says (or if it is gone), Postgres decides.
            job = await self.ctx.tx(read)
            seen = (job.state, job.progress.SerializeToString(deterministic=True))
            if seen != last_seen or events:
                kind = "state" if seen[0] != last_seen[0] else "progress"
                last_seen = seen
                yield api_pb2.WatchJobResponse(job=job, event=kind)

    async def _last_event_id(self, job_id: str) -> str:
        try:
            return await asyncio.to_thread(self.ctx.live.last_event_id, job_id)
        except Exception:  # noqa: BLE001
            return "$"

    async def _next_events(self, job_id: str, last_id: str) -> tuple[list[str], str]:
        try:
            events = await asyncio.to_thread(self.ctx.live.read_job_events, job_id, last_id, 1000)
        except Exception:  # noqa: BLE001 - Redis down: fall back to polling Postgres
            await asyncio.sleep(1.0)
            return [], last_id
        if not events:
            return [], last_id
        return [e[1] for e in events], events[-1][0]

    async def StreamLogs(self, request: api_pb2.StreamLogsRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[api_pb2.StreamLogsResponse]:
        identity = current_identity()

        def locate(session: Session) -> tuple[str, str]:
            job = _visible_job(session, request.id, identity)
            if not job.node:
                raise FailedPrecondition(f"job {job.id} has not run yet ({job.state})")
            node = queries.get_node(session, job.node)
            return job.state, node.address if node else ""

        offset = request.offset
        while True:
            state, address = await self.ctx.tx(locate)
            finished = state not in jobstate.HOLDING_STATES
            try:
                reply = await self.ctx.agents.stub(address).ReadLog(
                    agent_pb2.ReadLogRequest(job_id=request.id, offset=offset, max_bytes=256 * 1024),
                    timeout=10,
                    metadata=self.ctx.agents.metadata,
                )
            except grpc.aio.AioRpcError as exc:
                raise FailedPrecondition(f"log of {request.id} unavailable: node unreachable ({exc.code().name})") from exc
            if reply.data:
                offset = reply.offset
                yield api_pb2.StreamLogsResponse(data=reply.data, offset=offset)
                continue
            if not request.follow or finished:
                return
            await asyncio.sleep(0.3)


FINAL_PROTO_STATES = {convert.state_value(s) for s in jobstate.FINAL_STATES}
PENDING_PROTO = convert.state_value(jobstate.PENDING)


def _token_expiry(request: api_pb2.CreateTenantRequest | api_pb2.IssueTenantTokenRequest) -> datetime | None:
    """When a token asked for with `token_ttl` (unset or zero: never) expires."""
    if not request.HasField("token_ttl"):
        return None
    ttl = request.token_ttl
    seconds = ttl.seconds + ttl.nanos / 1e9
    if seconds < 0 or ttl.nanos < 0:
        raise InvalidArgument("token_ttl", f"must not be negative (got {seconds:g}s)")
    if seconds > MAX_TOKEN_TTL_S:
        raise InvalidArgument("token_ttl", f"at most {MAX_TOKEN_TTL_S // 86400} days (got {seconds:g}s)")
    return None if seconds == 0 else utcnow() + timedelta(seconds=seconds)


class TenantService(api_pb2_grpc.TenantServiceServicer):
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def WhoAmI(self, request: api_pb2.WhoAmIRequest, context: grpc.aio.ServicerContext) -> api_pb2.WhoAmIResponse:
        identity = current_identity()  # the interceptor refused an unknown token already
        return api_pb2.WhoAmIResponse(admin=identity.is_admin, tenant="" if identity.is_admin else identity.tenant)

    async def CreateTenant(self, request: api_pb2.CreateTenantRequest, context: grpc.aio.ServicerContext) -> api_pb2.CreateTenantResponse:
        current_identity().require_admin()
        name = request.name
        if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
            raise InvalidArgument("name", "1-64 letters, digits, '-' or '_'")
        share = request.share or 1.0
        if not (0 < share <= 1e6):
            raise InvalidArgument("share", f"must be positive (got {request.share:g})")
        expires_at = _token_expiry(request)
        token = new_token("rt")
        tenant = await self.ctx.tx(lambda s: convert.tenant_to_proto(
            repository.create_tenant(s, name, share, hash_token(token), expires_at)))
        return api_pb2.CreateTenantResponse(tenant=tenant, token=token)

    async def IssueTenantToken(
        self, request: api_pb2.IssueTenantTokenRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.IssueTenantTokenResponse:
        current_identity().require_admin()
        if not request.name:
            raise InvalidArgument("name", "required")
        expires_at = _token_expiry(request)
        token = new_token("rt")
        tenant = await self.ctx.tx(lambda s: convert.tenant_to_proto(
            repository.replace_token(s, request.name, hash_token(token), expires_at)))
        return api_pb2.IssueTenantTokenResponse(tenant=tenant, token=token)

    async def ListTenants(self, request: api_pb2.ListTenantsRequest, context: grpc.aio.ServicerContext) -> api_pb2.ListTenantsResponse:
        identity = current_identity()

        def read(session: Session) -> list[common_pb2.Tenant]:
            return [convert.tenant_to_proto(t) for t in repository.list_tenants(session) if identity.may_access(t.name)]

        return api_pb2.ListTenantsResponse(tenants=await self.ctx.tx(read))


class ClusterService(api_pb2_grpc.ClusterServiceServicer):
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def ListNodes(self, request: api_pb2.ListNodesRequest, context: grpc.aio.ServicerContext) -> api_pb2.ListNodesResponse:
        identity = current_identity()

        def read(session: Session) -> list[common_pb2.Node]:
            rows = queries.list_nodes(session)
            nodes = [job_protos.node_to_proto(n, g, c) for n, g, c in rows]
            if not identity.is_admin:  # who holds a GPU: the caller's own jobs by id, others' as "*"
                held = {c.job_id for _n, _g, claims in rows for c in claims}
                theirs = {j for j, t in queries.job_tenants(session, held).items() if not identity.may_access(t)}
                for node in nodes:
                    for gpu in node.gpus:
                        if gpu.job_id in theirs:
                            gpu.job_id = OTHER_TENANT
            return nodes

        return api_pb2.ListNodesResponse(nodes=await self.ctx.tx(read))

    async def GetPlacement(self, request: api_pb2.GetPlacementRequest, context: grpc.aio.ServicerContext) -> api_pb2.GetPlacementResponse:
        identity = current_identity()

        def read(session: Session) -> list[common_pb2.Placement]:
            jobs = queries.list_jobs(session, "" if identity.is_admin else identity.tenant, list(jobstate.HOLDING_STATES), MAX_LIST)
            return [common_pb2.Placement(job_id=j.id, node=j.node or "", gpus=list(j.gpu_indices), epoch=j.epoch) for j in jobs]

        placements = await self.ctx.tx(read)
        return api_pb2.GetPlacementResponse(placements=placements, epoch=max((p.epoch for p in placements), default=0))


class NodeService(node_pb2_grpc.NodeServiceServicer):
    """The agents' RPCs, served on the api's node port (Settings.node_listen) and never on
    the public endpoint. Admin token only."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def Register(self, request: node_pb2.NodeServiceRegisterRequest, context: grpc.aio.ServicerContext) -> node_pb2.NodeServiceRegisterResponse:
        return node_pb2.NodeServiceRegisterResponse(node=await register_node(self.ctx, request.node))

    async def Heartbeat(self, request: node_pb2.NodeServiceHeartbeatRequest, context: grpc.aio.ServicerContext) -> node_pb2.NodeServiceHeartbeatResponse:
        assignments, health = await node_heartbeat(self.ctx, request.node, request.jobs)
        return node_pb2.NodeServiceHeartbeatResponse(assignments=assignments, health=health)


async def register_node(ctx: ApiContext, node: common_pb2.Node) -> common_pb2.Node:
    """Registers or re-registers a node and its GPUs (admin only)."""
    current_identity().require_admin()
    if not node.name:
        raise InvalidArgument("node.name", "must not be empty")
    if not node.address:
        raise InvalidArgument("node.address", "must not be empty")
    gpus = [node_lifecycle.GpuInfo(index=g.index, uuid=g.uuid, model=g.model, virtual=g.virtual, gpu_type=g.type)
            for g in node.gpus]
    if sorted(g.index for g in gpus) != list(range(len(gpus))):
        raise InvalidArgument("node.gpus", "indices must be 0..n-1")
    labels = _checked_node_labels(node)
    if not (math.isfinite(node.cpus) and node.cpus >= 0) or node.memory_bytes < 0:
        raise InvalidArgument("node.cpus" if node.memory_bytes >= 0 else "node.memory_bytes", "must not be negative")

    def register(session: Session) -> common_pb2.Node:
        row = node_lifecycle.register(session, node.name, node.address, gpus, labels, (node.cpus, node.memory_bytes))
        session.flush()
        nodes = {n.name: (n, g, c) for n, g, c in queries.list_nodes(session)}
        return job_protos.node_to_proto(*nodes[row.name])

    return await ctx.tx(register)


def _checked_node_labels(node: common_pb2.Node) -> dict[str, str]:
    """The node's labels, once its GPU types and labels pass rota.core.nodelabels' rules
    (what the agent checked before sending them; an older or foreign client may not have)."""
    for i, gpu in enumerate(node.gpus):
        problem = type_problem(gpu.type)
        if problem is not None:
            raise InvalidArgument(f"node.gpus[{i}].type", problem)
    labels = dict(node.labels)
    bad = labels_problem(labels)
    if bad is not None:
        key, reason = bad
        raise InvalidArgument(f"node.labels[{key[:64]}]" if key else "node.labels", reason)
    return labels


async def node_heartbeat(
    ctx: ApiContext, node_name: str, jobs: Sequence[api_pb2.AgentJobReport],
) -> tuple[list[api_pb2.Assignment], common_pb2.NodeHealth.ValueType]:
    """A node's beat (admin only): its jobs' reports in; what is placed on it, and its health, out."""
    current_identity().require_admin()
    reports = [
        heartbeats.JobReport(
            job_id=r.job_id,
            epoch=r.epoch,
            state=convert.state_name(r.state, f"jobs[{i}].state"),
            exit_code=r.exit_code,
            error=r.error[-8192:],
            progress=convert.progress_from_json(r.progress_json),
        )
        for i, r in enumerate(jobs)
    ]
    events = Events()

    def beat(session: Session) -> tuple[list[api_pb2.Assignment], common_pb2.NodeHealth.ValueType]:
        node, assigned = heartbeats.heartbeat(session, node_name, reports, events)
        return [
            # A job not yet started restores from its last image, with the layout an
            # applied re-plan gave it: as the allocator's launch.
            api_pb2.Assignment(
                job=job_protos.job_on_node(j, node_name),  # a realtime app: this node's replicas only
                **(read_models.launch_fields(session, j.id) if j.state == jobstate.SCHEDULED else {}))
            for j in assigned
        ], convert.health_value(node.health)

    response = await ctx.tx(beat)
    await ctx.publish(events)
    try:
        await asyncio.to_thread(
            ctx.live.record_heartbeat,
            node_name,
            {"node": node_name, "at": time.time(), "jobs": [r.job_id for r in jobs]},
            ctx.settings.node_timeout_s,
        )
    except Exception as exc:  # noqa: BLE001 - the cache may be down; Postgres has the heartbeat
        log.debug("heartbeat cache write failed: %s", exc)
    return response
