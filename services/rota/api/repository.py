"""The api's Postgres operations: tenants, submissions, cancellation, nodes, heartbeats."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from rota.api import apps, gangs
from rota.common import nodes_repo, replicas
from rota.common.jobs_repo import (
    Events,
    get_job,
    new_job_id,
    nodes_of,
    on_node,
    pause,
    release,
    requeue_or_fail,
    transition,
)
from rota.common.models import GpuClaimRow, GpuRow, JobRow, NodeRow, TenantRow
from rota.core import jobstate
from rota.core.errors import AlreadyExists, DomainError, InvalidArgument, NotFound
from rota.core.jobspec import JobSpecData


# Tenants.
def create_tenant(
    session: Session, name: str, share: float, token_hash: str, token_expires_at: datetime | None = None
) -> TenantRow:
    if session.get(TenantRow, name) is not None:
        raise AlreadyExists(f"tenant {name!r} already exists")
    tenant = TenantRow(name=name, share=share, token_hash=token_hash, token_expires_at=token_expires_at)
    session.add(tenant)
    session.flush()
    return tenant


def replace_token(session: Session, name: str, token_hash: str, token_expires_at: datetime | None) -> TenantRow:
    """The tenant's new token (its old one matches nothing from now on)."""
    tenant = session.get(TenantRow, name, with_for_update=True)
    if tenant is None:
        raise NotFound(f"tenant {name!r} not found")
    tenant.token_hash, tenant.token_expires_at = token_hash, token_expires_at
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


@dataclass(frozen=True)
class NodeShape:
    """What submissions are validated against: the largest node and the GPU types present."""

    largest_node_gpus: int
    gpu_types: frozenset[str]


def node_shape(session: Session) -> NodeShape:
    types = session.scalars(select(GpuRow.gpu_type).where(GpuRow.gpu_type != "").distinct()).all()
    return NodeShape(largest_node_gpus(session), frozenset(types))


def find_by_request_id(session: Session, tenant: str, request_id: str) -> JobRow | None:
    stmt = select(JobRow).where(JobRow.tenant == tenant, JobRow.request_id == request_id)
    return session.scalars(stmt).first()


@dataclass
class Submission:
    """One validated submission; `body` is the spec as canonical JSON (its digest is the
    request body's identity for idempotent retries, and it is what the row stores)."""

    spec: JobSpecData
    request_id: str
    body: str = ""
    digest: str = ""
    job_id: str = ""

    def __post_init__(self) -> None:
        if not self.body:
            self.body = self.spec.canonical_json()
            self.digest = hashlib.sha256(self.body.encode()).hexdigest()
        if not self.job_id:
            self.job_id = new_job_id()


@dataclass(frozen=True)
class Stored:
    """Where a submission ended: a new job (created, with its creation time) or the job
    an earlier submission with the same request id made (not created)."""

    job_id: str
    created: bool
    created_at: datetime | None = None


# One statement stores a whole batch (driver parameter style, so the api's batch writer
# and a Session run the same text). Rows of unknown tenants drop out in the join, rows
# whose (tenant, request id) exists already drop out in ON CONFLICT: ON CONFLICT waits for
# a concurrent uncommitted insert of the same key and then skips it, the retry semantics
# the old advisory lock gave, in one round trip. Rows go in key order, so two batches
# sharing keys wait on each other in one order only (no deadlock), and of two equal
# request ids in one batch the one that arrived first is stored. The text is the same
# for every batch size, so the server plans it once per connection. The arrays go in
# binary (%b): in text form every character of every JSON body is escaped for the array
# literal, which cost more CPU than the rest of the statement.
INSERT_BATCH_SQL = """
INSERT INTO jobs (id, tenant, name, kind, priority, gpus, spec, spec_hash, request_id, state,
                  reason, gpu_indices, progress, error, epoch, attempts)
SELECT v.id, v.tenant, v.name, v.kind, v.priority, v.gpus, v.spec::jsonb, v.spec_hash, v.request_id,
       %(state)s, 'submitted', '{}', '{}', '', 0, 0
FROM unnest(%(ids)b::text[], %(tenants)b::text[], %(names)b::text[], %(kinds)b::text[],
            %(priorities)b::int[], %(gpus)b::int[], %(specs)b::text[], %(hashes)b::text[],
            %(request_ids)b::text[]) WITH ORDINALITY
     AS v(id, tenant, name, kind, priority, gpus, spec, spec_hash, request_id, n)
JOIN tenants t ON t.name = v.tenant
ORDER BY v.tenant, v.request_id, v.n
ON CONFLICT (tenant, request_id) DO NOTHING
RETURNING id, created_at
"""

# The earlier jobs of the submissions that were not inserted (a retry, or a request id
# reused): committed ones, and this transaction's own when it inserts them too.
FIND_REQUESTS_SQL = """
SELECT j.tenant, j.request_id, j.id, j.spec_hash FROM jobs j
JOIN unnest(%(tenants)s::text[], %(request_ids)s::text[]) AS k(tenant, request_id)
  ON j.tenant = k.tenant AND j.request_id = k.request_id
"""


def insert_params(batch: Sequence[Submission]) -> dict[str, Any]:
    return {
        "state": jobstate.PENDING,
        "ids": [s.job_id for s in batch],
        "tenants": [s.spec.tenant for s in batch],
        "names": [s.spec.name for s in batch],
        "kinds": [s.spec.kind for s in batch],
        "priorities": [s.spec.priority for s in batch],
        "gpus": [s.spec.gpus for s in batch],
        "specs": [s.body for s in batch],
        "hashes": [s.digest for s in batch],
        "request_ids": [s.request_id or None for s in batch],
    }


def find_params(batch: Sequence[Submission], inserted: dict[str, datetime]) -> dict[str, Any] | None:
    """Parameters of FIND_REQUESTS_SQL for what was not inserted; None when nothing is to find."""
    keys = sorted({(s.spec.tenant, s.request_id) for s in batch if s.job_id not in inserted and s.request_id})
    if not keys:
        return None
    return {"tenants": [t for t, _ in keys], "request_ids": [r for _, r in keys]}


def outcomes(
    batch: Sequence[Submission], inserted: dict[str, datetime], earlier: Sequence[Sequence[Any]]
) -> list[Stored | DomainError]:
    """Per submission: Stored, or the error that submission alone gets. Same request id +
    same body -> the first job; another body -> ALREADY_EXISTS; two equal request ids in
    one batch behave as if submitted one after the other."""
    first = {(str(tenant), str(request_id)): (str(job_id), str(digest)) for tenant, request_id, job_id, digest in earlier}
    results: list[Stored | DomainError] = []
    for s in batch:
        at = inserted.get(s.job_id)
        if at is not None:
            results.append(Stored(s.job_id, True, at))
            continue
        found = first.get((s.spec.tenant, s.request_id)) if s.request_id else None
        if found is None:
            results.append(InvalidArgument("tenant", f"unknown tenant {s.spec.tenant!r}"))
        elif found[1] != s.digest:
            results.append(AlreadyExists(f"request_id {s.request_id!r} was used for a different job ({found[0]})"))
        else:
            results.append(Stored(found[0], False))
    return results


def submit_jobs(session: Session, batch: Sequence[Submission]) -> list[Stored | DomainError]:
    """Stores validated specs as PENDING in the session's transaction (see `outcomes`)."""
    if not batch:
        return []
    conn = session.connection()
    inserted = {str(job_id): at for job_id, at in conn.exec_driver_sql(INSERT_BATCH_SQL, insert_params(batch))}
    find = find_params(batch, inserted)
    earlier = conn.exec_driver_sql(FIND_REQUESTS_SQL, find).all() if find is not None else []
    return outcomes(batch, inserted, earlier)


def submit_job(
    session: Session, spec: JobSpecData, request_id: str, events: Events
) -> tuple[JobRow, bool]:
    """Stores a validated spec as PENDING. Same request id + same body -> the first job."""
    [result] = submit_jobs(session, [Submission(spec, request_id)])
    if isinstance(result, DomainError):
        raise result
    job = session.get(JobRow, result.job_id)
    assert job is not None  # inserted or found in this very transaction
    if result.created:
        events.add(job, "state")
    return job, result.created


def list_jobs(session: Session, tenant: str, states: Sequence[str], limit: int) -> Sequence[JobRow]:
    stmt = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.array_index, JobRow.id).limit(limit)
    if tenant:
        stmt = stmt.where(JobRow.tenant == tenant)
    if states:
        stmt = stmt.where(JobRow.state.in_(states))
    return session.scalars(stmt).all()


def guests_of(session: Session, host_id: str, tenant: str = "") -> list[str]:
    """The trials running as guests in the host's bubbles now; only `tenant`'s when given."""
    stmt = select(JobRow.id).where(JobRow.guest_of == host_id, JobRow.state.in_(jobstate.HOLDING_STATES))
    if tenant:
        stmt = stmt.where(JobRow.tenant == tenant)
    return list(session.scalars(stmt.order_by(JobRow.id)).all())


def cancel_job(session: Session, job_id: str, reason: str, events: Events) -> tuple[JobRow, list[str]]:
    """Cancels an unfinished job; returns it and the nodes whose agents must stop it (a
    gang's every node; none if it held no GPU)."""
    job = get_job(session, job_id, lock=True)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job, cancel_row(session, job, reason, events)


def cancel_row(session: Session, job: JobRow, reason: str, events: Events) -> list[str]:
    """cancel_job of a row its caller has locked (an array's tasks, read in one statement)."""
    if job.state in jobstate.FINAL_STATES:
        return []
    nodes = nodes_of(job) if job.state in jobstate.HOLDING_STATES else []
    if nodes:
        release(session, job, "cancelled")
    transition(session, job, jobstate.CANCELLED, reason or "cancelled by user", events)
    return nodes


# Nodes.
def job_tenants(session: Session, job_ids: set[str]) -> dict[str, str]:
    """Each job's tenant (jobs that are gone are absent)."""
    if not job_ids:
        return {}
    return dict(session.execute(select(JobRow.id, JobRow.tenant).where(JobRow.id.in_(sorted(job_ids)))).tuples().all())


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
    node = nodes_repo.beat(session, node_name)
    # One locked read of what the node holds serves both the reports and the answer (a
    # query per report cost about a millisecond of CPU each): a report about anything
    # else (requeued, placed elsewhere, finished) changes nothing.
    held = session.scalars(
        select(JobRow)
        .where(on_node(node_name), JobRow.state.in_(jobstate.HOLDING_STATES))
        .order_by(JobRow.id)
        .with_for_update()
    ).all()
    by_id = {job.id: job for job in held}
    for report in reports:
        job = by_id.get(report.job_id)
        if job is None or replicas.node_epoch(job, node_name) != report.epoch:  # an app: this node's lease's
            continue
        if job.gang_nodes:
            gangs.apply_gang_report(session, job, node_name, report, events)
        elif not replicas.is_app(job):
            _apply_report(session, job, report, events)
        elif (alone := apps.apply_node_report(session, job, node_name, report, events)) is not None:
            _apply_report(session, job, alone, events)  # an app on this node alone
    _record_cancelled_exits(session, node_name, [r for r in reports if r.job_id not in by_id])
    assigned = [job for job in held if job.state in jobstate.HOLDING_STATES]
    return node, assigned


def _record_cancelled_exits(session: Session, node_name: str, reports: Sequence[JobReport]) -> None:
    """The exit code of a cancelled job's process (143 after SIGTERM). A cancel commits
    CANCELLED before the api stops the process, so the stopped process's report comes
    after the job let go of its GPUs; it is kept when it is of the cancelled placement
    (epoch and node) and the first one (a gang's other nodes report too)."""
    for report in reports:
        if report.state not in (jobstate.SUCCEEDED, jobstate.FAILED):
            continue
        session.execute(
            update(JobRow)
            .where(JobRow.id == report.job_id, JobRow.epoch == report.epoch, JobRow.state == jobstate.CANCELLED,
                   JobRow.exit_code.is_(None), on_node(node_name))
            .values(exit_code=report.exit_code)
        )


def _apply_report(session: Session, job: JobRow, report: JobReport, events: Events) -> None:
    """A single-node job's report (a gang's: rota.api.gangs)."""
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


