"""Job persistence shared by the api and the allocator: state changes, claims, history.

Functions take an open Session (one transaction) and never call the network: callers
publish events and tell agents after the commit.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, any_, delete, or_, select, update
from sqlalchemy.orm import Session

from rota.cluster.models import GpuClaimRow, GpuGuestRow, JobRow, JobTransitionRow, PlacementRow
from rota.common import metrics
from rota.common.read_models import resume_image, streamed_image
from rota.core import jobstate
from rota.core.errors import NotFound


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    return "j-" + secrets.token_hex(5)


@dataclass
class Events:
    """Events to publish once the transaction commits: (job id, event, job snapshot), and
    whether GPUs were freed without a job changing state (a stopped gang's last ranks
    ended): the allocator has work then too."""

    items: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    gpus_freed: bool = False

    def add(self, job: JobRow, event: str) -> None:
        self.items.append((job.id, event, job_snapshot(job)))


def job_snapshot(job: JobRow) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "reason": job.reason,
        "node": job.node,
        "gpus": list(job.gpu_indices),
        "epoch": job.epoch,
        "progress": job.progress,
    }


def get_job(session: Session, job_id: str, *, lock: bool = False) -> JobRow | None:
    stmt = select(JobRow).where(JobRow.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def history(session: Session, job_id: str) -> Sequence[JobTransitionRow]:
    stmt = select(JobTransitionRow).where(JobTransitionRow.job_id == job_id).order_by(JobTransitionRow.id)
    return session.scalars(stmt).all()


def transition(session: Session, job: JobRow, target: str, reason: str, events: Events) -> None:
    """Moves a job to `target`, recording the change with its reason."""
    jobstate.check_transition(job.state, target)
    session.add(JobTransitionRow(job_id=job.id, from_state=job.state, to_state=target, reason=reason))
    job.state = target
    job.reason = reason
    now = utcnow()
    if target == jobstate.RUNNING and job.started_at is None:
        job.started_at = now
        if job.created_at is not None:
            metrics.QUEUE_WAIT.labels(kind=job.kind).observe(max(0.0, (now - job.created_at).total_seconds()))
    if target in jobstate.FINAL_STATES:
        job.finished_at = now
    events.add(job, "state")


def release(session: Session, job: JobRow, reason: str, *, keep_nodes: Sequence[str] = ()) -> None:
    """Frees the job's GPUs: claims (and a guest's lent GPUs) deleted, its open placements
    closed (a realtime app's on every node). A host's guests keep theirs: the allocator's
    next cycle gives them the GPUs (rota.cluster.guest_leases.take_over). `keep_nodes`: a
    stopped gang's nodes whose ranks may still run keep their claims until they stop
    (rota.cluster.gang_reports.settle_stopped_groups)."""
    claims = delete(GpuClaimRow).where(GpuClaimRow.job_id == job.id)
    if keep_nodes:
        claims = claims.where(GpuClaimRow.node.notin_(list(keep_nodes)))
    session.execute(claims)
    session.execute(delete(GpuGuestRow).where(GpuGuestRow.job_id == job.id))
    job.replicas = {}
    session.execute(
        update(PlacementRow)
        .where(PlacementRow.job_id == job.id, PlacementRow.released_at.is_(None))
        .values(released_at=utcnow(), release_reason=reason)
    )


MAX_RESTORES = 5  # placements after which a lost job is left to its restart policy


def requeue_or_fail(session: Session, job: JobRow, why: str, events: Events, image: str = "") -> None:
    """After a failed or lost attempt: back to PENDING if the restart policy allows, else FAILED.

    `image` names the job's last complete checkpoint image when the attempt was lost to
    its node or a rank (not to the job itself): the job is restored from it elsewhere,
    whatever its restart policy, as a paused job would be resumed; up to MAX_RESTORES
    placements, so a job that itself hangs its ranks does not come back for ever.
    """
    spec = job.spec
    if image and job.attempts < MAX_RESTORES:
        _requeue(session, job, f"{why}; restored from its last image {image} on the next placement", events)
    elif jobstate.should_retry(spec.get("restart", "never"), job.attempts, spec.get("max_retries", 0)):
        _requeue(session, job, f"{why}; retry {job.attempts}/{spec.get('max_retries', 0)} (restart: on-failure)", events)
    else:
        transition(session, job, jobstate.FAILED, why, events)


def lose(session: Session, job: JobRow, why: str, events: Events, *, release_reason: str,
         dead_node: str = "") -> None:
    """The one path by which a holding job is lost (its node died, or one of its ranks went silent):
    its GPUs are released, it becomes LOST, then it is requeued (restored from its resume
    image when it has one, read from the checkpoint service's read model) or failed by its
    restart policy. The caller holds the job's row lock.

    A gang's ranks on its nodes other than `dead_node` may still run: their GPUs stay
    claimed until those nodes report them ended or die, and the gang is not placed again
    before (rota.cluster.gang_reports.settle_stopped_groups)."""
    release(session, job, release_reason, keep_nodes=[n for n in job.gang_nodes if n != dead_node])
    transition(session, job, jobstate.LOST, why, events)
    # A migration's image still being written counts: the next start streams or reads it.
    streamed = streamed_image(session, job.id)
    requeue_or_fail(session, job, why, events, streamed.image_id if streamed else resume_image(session, job.id) or "")


def _requeue(session: Session, job: JobRow, reason: str, events: Events) -> None:
    transition(session, job, jobstate.PENDING, reason, events)
    unplace(job)


def on_node(node: str) -> ColumnElement[bool]:
    """Jobs placed on `node`: there alone, as one node of a gang, or with replicas there (a realtime app)."""
    return or_(JobRow.node == node, any_(JobRow.gang_nodes) == node, JobRow.replicas.has_key(node))


def nodes_of(job: JobRow) -> list[str]:
    """The nodes a placed job runs on: a gang's every node, a realtime app's (home first),
    else its one node ([] if none)."""
    if job.replicas:
        return sorted(job.replicas, key=lambda n: (n != job.node, n))
    return list(job.gang_nodes) or ([job.node] if job.node else [])


def unplace(job: JobRow) -> None:
    """The job holds no GPU any more: no node, no gang, no replicas (its GPUs were released)."""
    job.node, job.gpu_indices = None, []
    job.gang_nodes, job.gang_master = [], ""
    job.replicas = {}
    job.guest_of = ""


def pause(session: Session, job: JobRow, reason: str, events: Events) -> None:
    """A running job stopped at a checkpoint: GPUs freed (its lease closes, so the ledger
    charges running time only), PAUSED until resumed from its image."""
    release(session, job, "paused")
    transition(session, job, jobstate.PAUSED, reason, events)
    unplace(job)


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
