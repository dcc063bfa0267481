"""The detector's Postgres operations: verdicts, a lost rank's job, draining nodes, applied
layouts, and devices taken out of the plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.cluster import queries
from rota.cluster.job_lifecycle import Events, get_job, lose, utcnow
from rota.common import metrics
from rota.core import jobstate
from rota.core.detection.devices import BAD, CLEARED, DeviceMark
from rota.core.detection.failslow import Verdict
from rota.core.errors import InvalidArgument, NotFound
from rota.detector.models import DeviceHealthRow, JobLayoutRow, VerdictRow


@dataclass(frozen=True)
class Placement:
    """Where a job runs now, as the detector needs it to judge and place a verdict."""

    job_id: str
    tenant: str
    state: str
    epoch: int
    node: str | None
    gpus: tuple[int, ...]
    accepts_layout_changes: bool = False

    @property
    def holding(self) -> bool:
        return self.state in jobstate.HOLDING_STATES

    def gpu_of(self, rank: int) -> int | None:
        """The GPU rank r runs on when each rank has one of the job's GPUs (rank order)."""
        return self.gpus[rank] if 0 <= rank < len(self.gpus) else None


def placement(session: Session, job_id: str, epoch: int | None = None) -> Placement | None:
    """Where the job runs now; with `epoch`, where it ran under that epoch (a verdict on an
    older placement names the devices of that one, not of wherever the job went since)."""
    job = get_job(session, job_id)
    if job is None:
        return None
    accepts = bool((job.spec or {}).get("accepts_layout_changes"))
    node, gpus = job.node, tuple(job.gpu_indices)
    if epoch is not None:
        then = queries.placement_at(session, job_id, epoch)
        if then is not None:
            node, gpus = then
    return Placement(job.id, job.tenant, job.state, job.epoch, node, gpus, accepts)


def record_verdict(session: Session, where: Placement, epoch: int, verdict: Verdict, extra: dict[str, Any]) -> VerdictRow | None:
    """Stores a verdict once (by job, epoch, rank, kind, iteration); None if it was already there."""
    key = f"{where.job_id}:{epoch}:{verdict.rank}:{verdict.kind}:{verdict.iteration}"
    stmt = insert(VerdictRow).values(
        key=key, job_id=where.job_id, epoch=epoch, rank=verdict.rank, kind=verdict.kind, iteration=verdict.iteration,
        ratio=verdict.ratio, node=where.node, gpu=where.gpu_of(verdict.rank), evidence={**verdict.evidence, **extra},
    ).on_conflict_do_nothing(index_elements=["key"]).returning(VerdictRow.id)
    new_id = session.execute(stmt).scalar()
    if new_id is None:
        return None
    metrics.VERDICTS.labels(kind=verdict.kind).inc()  # a new verdict, not a repeated report
    return session.get(VerdictRow, new_id)


def rank_lost(session: Session, job_id: str, epoch: int, why: str, events: Events) -> bool:
    """A silent rank's job: LOST, then restored from its last image elsewhere, or requeued
    or failed by its restart policy.

    Only the placement the rank ran under is touched: if the job has moved on (a newer
    epoch, or it finished), the silence is history and nothing changes.
    """
    job = get_job(session, job_id, lock=True)
    if job is None or job.epoch != epoch or job.state not in jobstate.HOLDING_STATES:
        return False
    lose(session, job, why, events, release_reason="rank lost")
    return True


def verdicts(session: Session, *, job_id: str = "", tenant: str = "", limit: int = 100) -> Sequence[VerdictRow]:
    """Newest first: one job's, or every job's (of one tenant when `tenant` is set)."""
    stmt = select(VerdictRow).order_by(VerdictRow.id.desc()).limit(limit)
    if job_id:
        stmt = stmt.where(VerdictRow.job_id == job_id)
    if tenant:
        stmt = stmt.where(VerdictRow.job_id.in_(queries.tenant_job_ids(tenant)))
    return session.scalars(stmt).all()


def check_name(field: str, value: str, longest: int) -> None:
    """Ids and names as Postgres can hold them: present, not too long, no control characters."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > longest or any(ord(c) < 32 for c in value):
        raise InvalidArgument(field, f"not a valid name (at most {longest} printable characters)")


# Applied layouts.
@dataclass(frozen=True)
class StoredLayout:
    layout: dict[str, Any]
    from_epoch: int
    operation_id: str


def layout_of(session: Session, job_id: str) -> StoredLayout | None:
    row = session.get(JobLayoutRow, job_id)
    return StoredLayout(dict(row.layout), row.from_epoch, row.operation_id) if row is not None else None


def store_layout(session: Session, job_id: str, stored: StoredLayout) -> StoredLayout | None:
    """Makes the layout the job's from its next launch on; returns the one it replaces, if any."""
    row = session.get(JobLayoutRow, job_id, with_for_update=True)
    if row is None:
        session.add(JobLayoutRow(job_id=job_id, layout=stored.layout, from_epoch=stored.from_epoch,
                                 operation_id=stored.operation_id))
        return None
    previous = StoredLayout(dict(row.layout), row.from_epoch, row.operation_id)
    row.layout, row.from_epoch, row.operation_id, row.updated_at = (
        stored.layout, stored.from_epoch, stored.operation_id, utcnow())
    return previous


def restore_layout(session: Session, job_id: str, applied: StoredLayout, previous: StoredLayout | None) -> bool:
    """Undoes `store_layout` after the restart was refused, unless a newer re-plan replaced it."""
    row = session.get(JobLayoutRow, job_id, with_for_update=True)
    if row is None or row.operation_id != applied.operation_id:
        return False
    if previous is None:
        session.delete(row)
    else:
        row.layout, row.from_epoch, row.operation_id, row.updated_at = (
            previous.layout, previous.from_epoch, previous.operation_id, utcnow())
    return True


# Devices out of the plan.
def mark_device(session: Session, mark: DeviceMark) -> bool:
    """The device is BAD from now on; True when it was not already (a BAD device keeps its
    first reason and time: the first verdict is the one worth looking at)."""
    if queries.get_node(session, mark.node) is None:
        return False  # a node that was never registered (or is gone) has no device to keep out
    stmt = insert(DeviceHealthRow).values(
        node=mark.node, gpu_index=mark.gpu, state=BAD, reason=mark.reason, job_id=mark.job_id, rank=mark.rank,
        kind=mark.kind, since=func.now(), cleared_at=None,
    )
    upsert = stmt.on_conflict_do_update(
        index_elements=["node", "gpu_index"],
        set_={c: stmt.excluded[c] for c in ("state", "reason", "job_id", "rank", "kind", "since", "cleared_at")},
        where=DeviceHealthRow.state != BAD,
    ).returning(DeviceHealthRow.node)
    return session.execute(upsert).first() is not None


def devices(session: Session, *, include_cleared: bool = False) -> Sequence[DeviceHealthRow]:
    stmt = select(DeviceHealthRow).order_by(DeviceHealthRow.node, DeviceHealthRow.gpu_index)
    if not include_cleared:
        stmt = stmt.where(DeviceHealthRow.state == BAD)
    return session.scalars(stmt).all()


MAX_GPU_INDEX = 1 << 16


def clear_devices(session: Session, node: str, gpus: Sequence[int]) -> list[DeviceHealthRow]:
    """Puts the node's BAD devices (all, or those in `gpus`) back into the plan.

    All or nothing: naming a device that is not BAD clears none, so a typo cannot pass
    for a cleared device.
    """
    check_name("node", node, 64)
    if any(not 0 <= g < MAX_GPU_INDEX for g in gpus):
        raise InvalidArgument("gpus", f"GPU indices are 0..{MAX_GPU_INDEX - 1}")
    if queries.get_node(session, node) is None:
        raise NotFound(f"node {node} is not registered")
    stmt = select(DeviceHealthRow).where(DeviceHealthRow.node == node, DeviceHealthRow.state == BAD).with_for_update()
    rows = [r for r in session.scalars(stmt) if not gpus or r.gpu_index in set(gpus)]
    missing = sorted(set(gpus) - {r.gpu_index for r in rows})
    if missing:
        raise NotFound(f"not marked bad on {node}: GPU {', '.join(str(g) for g in missing)} (see rota health)")
    now = utcnow()
    for r in rows:
        r.state, r.cleared_at = CLEARED, now
    return rows


def tenants_of(session: Session, job_ids: set[str]) -> dict[str, str]:
    """Each job's tenant (jobs gone since are left out)."""
    return queries.job_tenants(session, job_ids)
