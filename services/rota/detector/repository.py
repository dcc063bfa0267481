"""The detector's Postgres operations: verdicts, a lost rank's job, and draining nodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.common import jobstate
from rota.common.errors import FailedPrecondition, InvalidArgument, NotFound
from rota.common.jobs_repo import Events, get_job, release, requeue_or_fail, transition
from rota.common.models import JobRow, NodeRow
from rota.detector.failslow import Verdict
from rota.detector.models import VerdictRow

ALIVE = "ALIVE"
DEAD = "DEAD"
DRAINING = "DRAINING"  # alive, takes no new jobs (the allocator plans ALIVE nodes only)


@dataclass(frozen=True)
class Placement:
    """Where a job runs now, as the detector needs it to judge and place a verdict."""

    job_id: str
    tenant: str
    state: str
    epoch: int
    node: str | None
    gpus: tuple[int, ...]

    @property
    def holding(self) -> bool:
        return self.state in jobstate.HOLDING_STATES

    def gpu_of(self, rank: int) -> int | None:
        """The GPU rank r runs on when each rank has one of the job's GPUs (rank order)."""
        return self.gpus[rank] if 0 <= rank < len(self.gpus) else None


def placement(session: Session, job_id: str) -> Placement | None:
    job = get_job(session, job_id)
    if job is None:
        return None
    return Placement(job.id, job.tenant, job.state, job.epoch, job.node, tuple(job.gpu_indices))


def record_verdict(session: Session, where: Placement, epoch: int, verdict: Verdict, extra: dict[str, Any]) -> VerdictRow | None:
    """Stores a verdict once (by job, epoch, rank, kind, iteration); None if it was already there."""
    key = f"{where.job_id}:{epoch}:{verdict.rank}:{verdict.kind}:{verdict.iteration}"
    stmt = insert(VerdictRow).values(
        key=key, job_id=where.job_id, epoch=epoch, rank=verdict.rank, kind=verdict.kind, iteration=verdict.iteration,
        ratio=verdict.ratio, node=where.node, gpu=where.gpu_of(verdict.rank), evidence={**verdict.evidence, **extra},
    ).on_conflict_do_nothing(index_elements=["key"]).returning(VerdictRow.id)
    new_id = session.execute(stmt).scalar()
    return session.get(VerdictRow, new_id) if new_id is not None else None


def rank_lost(session: Session, job_id: str, epoch: int, why: str, events: Events) -> bool:
    """A silent rank's job: LOST, then requeued or failed by its restart policy.

    Only the placement the rank ran under is touched: if the job has moved on (a newer
    epoch, or it finished), the silence is history and nothing changes.
    """
    job = get_job(session, job_id, lock=True)
    if job is None or job.epoch != epoch or job.state not in jobstate.HOLDING_STATES:
        return False
    release(session, job, "rank lost")
    transition(session, job, jobstate.LOST, why, events)
    requeue_or_fail(session, job, why, events)
    return True


def verdicts(session: Session, *, job_id: str = "", tenant: str = "", limit: int = 100) -> Sequence[VerdictRow]:
    """Newest first: one job's, or every job's (of one tenant when `tenant` is set)."""
    stmt = select(VerdictRow).order_by(VerdictRow.id.desc()).limit(limit)
    if job_id:
        stmt = stmt.where(VerdictRow.job_id == job_id)
    if tenant:
        stmt = stmt.join(JobRow, JobRow.id == VerdictRow.job_id).where(JobRow.tenant == tenant)
    return session.scalars(stmt).all()


def check_name(field: str, value: str, longest: int) -> None:
    """Ids and names as Postgres can hold them: present, not too long, no control characters."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > longest or any(ord(c) < 32 for c in value):
        raise InvalidArgument(field, f"not a valid name (at most {longest} printable characters)")


def drain(session: Session, name: str, undo: bool) -> tuple[str, int]:
    """Marks a node DRAINING (or ALIVE again); returns its health and how many jobs still run there.

    A DEAD node cannot be drained: its next heartbeat makes it ALIVE (the api's rule for a
    node that comes back), which would silently undo the drain.
    """
    check_name("node", name, 64)
    node = session.get(NodeRow, name, with_for_update=True)
    if node is None:
        raise NotFound(f"node {name} is not registered")
    if undo:
        if node.health == DRAINING:
            node.health = ALIVE
    elif node.health == DEAD:
        raise FailedPrecondition(f"node {name} is DEAD; drain it once it is back")
    else:
        node.health = DRAINING
    running = session.scalar(
        select(func.count()).select_from(JobRow).where(JobRow.node == name, JobRow.state.in_(jobstate.HOLDING_STATES))
    )
    return node.health, int(running or 0)
