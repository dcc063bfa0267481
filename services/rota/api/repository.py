"""The api's Postgres operations: tenants, submissions, cancellation, nodes, heartbeats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rota.common import jobstate
from rota.common.errors import AlreadyExists, InvalidArgument, NotFound
from rota.common.jobs_repo import (
    Events,
    get_job,
    new_job_id,
    pause,
    release,
    requeue_or_fail,
    transition,
    utcnow,
)
from rota.common.jobspec import JobSpecData
from rota.common.models import GpuClaimRow, GpuRow, JobRow, NodeRow, TenantRow

ALIVE = "ALIVE"
DEAD = "DEAD"
DRAINING = "DRAINING"  # set by `rota drain`: alive, takes no new jobs


# Tenants.
def create_tenant(session: Session, name: str, share: float, token_hash: str) -> TenantRow:
    if session.get(TenantRow, name) is not None:
        raise AlreadyExists(f"tenant {name!r} already exists")
    tenant = TenantRow(name=name, share=share, token_hash=token_hash)
    session.add(tenant)
    session.flush()
    return tenant


def list_tenants(session: Session) -> Sequence[TenantRow]:
    return session.scalars(select(TenantRow).order_by(TenantRow.name)).all()


def tenant_by_token_hash(session: Session, token_hash: str) -> TenantRow | None:
    return session.scalars(select(TenantRow).where(TenantRow.token_hash == token_hash)).first()


# Jobs.
def largest_node_gpus(session: Session) -> int:
    counts = select(func.count()).select_from(GpuRow).group_by(GpuRow.node)
    return max(session.scalars(counts).all(), default=0)


def find_by_request_id(session: Session, tenant: str, request_id: str) -> JobRow | None:
    stmt = select(JobRow).where(JobRow.tenant == tenant, JobRow.request_id == request_id)
    return session.scalars(stmt).first()


def submit_job(
    session: Session, spec: JobSpecData, request_id: str, events: Events
) -> tuple[JobRow, bool]:
    """Stores a validated spec as PENDING. Same request id + same body -> the first job."""
    digest = spec.digest()
    if request_id:
        # Retries of one request queue here until the first commits, then find its job:
        # a client that timed out and retried gets the first result, not a conflict.
        session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(f"{spec.tenant}/{request_id}", 0))))
        existing = find_by_request_id(session, spec.tenant, request_id)
        if existing is not None:
            if existing.spec_hash != digest:
                raise AlreadyExists(f"request_id {request_id!r} was used for a different job ({existing.id})")
            return existing, False
    if session.get(TenantRow, spec.tenant) is None:
        raise InvalidArgument("tenant", f"unknown tenant {spec.tenant!r}")
    job = JobRow(
        id=new_job_id(),
        tenant=spec.tenant,
        name=spec.name,
        kind=spec.kind,
        priority=spec.priority,
        gpus=spec.gpus,
        spec=spec.to_dict(),
        spec_hash=digest,
        request_id=request_id or None,
        state=jobstate.PENDING,
        reason="submitted",
        gpu_indices=[],
        progress={},
        error="",
        epoch=0,
        attempts=0,
    )
    session.add(job)
    try:
        session.flush()
    except IntegrityError as exc:  # a concurrent retry with the same request id won the race
        raise AlreadyExists(f"request_id {request_id!r} is being submitted concurrently") from exc
    events.add(job, "state")
    return job, True


def list_jobs(session: Session, tenant: str, states: Sequence[str], limit: int) -> Sequence[JobRow]:
    stmt = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.id).limit(limit)
    if tenant:
        stmt = stmt.where(JobRow.tenant == tenant)
    if states:
        stmt = stmt.where(JobRow.state.in_(states))
    return session.scalars(stmt).all()


def cancel_job(session: Session, job_id: str, reason: str, events: Events) -> tuple[JobRow, str | None]:
    """Cancels an unfinished job; returns it and the node whose agent must stop it, if any."""
    job = get_job(session, job_id, lock=True)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    if job.state in jobstate.FINAL_STATES:
        return job, None
    node = job.node if job.state in jobstate.HOLDING_STATES else None
    if node is not None:
        release(session, job, "cancelled")
    transition(session, job, jobstate.CANCELLED, reason or "cancelled by user", events)
    return job, node


# Nodes.
def register_node(session: Session, name: str, address: str, gpus: Sequence[GpuRow]) -> NodeRow:
    node = session.get(NodeRow, name)
    now = utcnow()
    if node is None:
        node = NodeRow(name=name, address=address, health=ALIVE, last_heartbeat=now)
        session.add(node)
    else:
        # A restarted agent re-registers: a drain outlives that, a death does not.
        health = DRAINING if node.health == DRAINING else ALIVE
        node.address, node.health, node.last_heartbeat = address, health, now
    session.flush()
    existing = {g.index: g for g in session.scalars(select(GpuRow).where(GpuRow.node == name))}
    for gpu in gpus:
        row = existing.pop(gpu.index, None)
        if row is None:
            session.add(GpuRow(node=name, index=gpu.index, uuid=gpu.uuid, model=gpu.model, virtual=gpu.virtual))
        else:
            row.uuid, row.model, row.virtual = gpu.uuid, gpu.model, gpu.virtual
    for stale in existing.values():
        session.delete(stale)
    return node


def list_nodes(session: Session) -> list[tuple[NodeRow, Sequence[GpuRow], Sequence[GpuClaimRow]]]:
    nodes = session.scalars(select(NodeRow).order_by(NodeRow.name)).all()
    gpus = session.scalars(select(GpuRow)).all()
    claims = session.scalars(select(GpuClaimRow)).all()
    return [
        (n, [g for g in gpus if g.node == n.name], [c for c in claims if c.node == n.name]) for n in nodes
    ]


@dataclass
class JobReport:
    job_id: str
    epoch: int
    state: str
    exit_code: int
    error: str
    progress: dict[str, object] | None


def heartbeat(
    session: Session, node_name: str, reports: Sequence[JobReport], events: Events
) -> tuple[NodeRow, Sequence[JobRow]]:
    """Applies an agent's reports and returns what the control plane has placed on the node.

    Reports from an older placement (epoch or node differ) are ignored: the job has been
    requeued and placed again, and the answer tells that agent to stop its copy.
    """
    node = session.get(NodeRow, node_name, with_for_update=True)
    if node is None:
        raise NotFound(f"node {node_name} is not registered")
    node.last_heartbeat = utcnow()
    if node.health == DEAD:
        node.health = ALIVE
    for report in reports:
        job = get_job(session, report.job_id, lock=True)
        if job is None or job.epoch != report.epoch or job.node != node_name:
            continue
        if job.state not in jobstate.HOLDING_STATES:
            continue
        _apply_report(session, job, report, events)
    assigned = session.scalars(
        select(JobRow).where(JobRow.node == node_name, JobRow.state.in_(jobstate.HOLDING_STATES))
    ).all()
    return node, assigned


def _apply_report(session: Session, job: JobRow, report: JobReport, events: Events) -> None:
    if report.progress is not None and report.progress != job.progress:
        job.progress = report.progress
        events.add(job, "progress")
    if job.state == jobstate.SCHEDULED and report.state in (jobstate.RUNNING, jobstate.SUCCEEDED, jobstate.FAILED, jobstate.PAUSED):
        transition(session, job, jobstate.RUNNING, f"started on {job.node} GPUs {list(job.gpu_indices)}", events)
    if report.state == jobstate.SUCCEEDED:
        job.exit_code = report.exit_code
        release(session, job, "succeeded")
        transition(session, job, jobstate.SUCCEEDED, "exit code 0", events)
    elif report.state == jobstate.PAUSED:
        # The job exited at a safe point after every rank's state was copied out: the
        # checkpoint coordinator records the image; the GPUs are free from now on.
        pause(session, job, f"paused at step {job.progress.get('step', '?')}: exited at a safe point", events)
    elif report.state == jobstate.FAILED:
        job.exit_code = report.exit_code
        job.error = report.error
        release(session, job, "failed")
        requeue_or_fail(session, job, f"exit code {report.exit_code}", events)


