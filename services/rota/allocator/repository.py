"""The allocator's Postgres operations: dead nodes, the snapshot, placement commits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from rota.allocator.placement import Decision, NodeFree, QueuedJob
from rota.common import jobstate
from rota.common.jobs_repo import Events, get_job, release, requeue_or_fail, transition, utcnow
from rota.common.jobspec import JobSpecData, gpus_to_hold
from rota.common.models import EPOCH_SEQUENCE, GpuClaimRow, GpuRow, JobRow, NodeRow, PlacementRow

ALIVE = "ALIVE"
DEAD = "DEAD"


def mark_dead_nodes(session: Session, timeout_s: float, events: Events) -> list[str]:
    """Nodes silent past the timeout become DEAD; their jobs LOST, then requeued or failed."""
    cutoff = utcnow() - timedelta(seconds=timeout_s)
    dead = session.scalars(
        select(NodeRow).where(NodeRow.health == ALIVE, NodeRow.last_heartbeat < cutoff).with_for_update()
    ).all()
    for node in dead:
        node.health = DEAD
        silent = (utcnow() - node.last_heartbeat).total_seconds()
        jobs = session.scalars(
            select(JobRow).where(JobRow.node == node.name, JobRow.state.in_(jobstate.HOLDING_STATES)).with_for_update()
        ).all()
        for job in jobs:
            why = f"node {node.name} missed heartbeats for {silent:.1f}s"
            release(session, job, "node lost")
            transition(session, job, jobstate.LOST, why, events)
            requeue_or_fail(session, job, why, events)
    return [n.name for n in dead]


@dataclass
class Snapshot:
    nodes: list[NodeFree]
    queue: list[QueuedJob]
    addresses: dict[str, str]
    holding: list[JobRow]


def snapshot(session: Session) -> Snapshot:
    nodes = session.scalars(select(NodeRow).where(NodeRow.health == ALIVE).order_by(NodeRow.name)).all()
    gpu_counts: dict[str, int] = {}
    for gpu in session.scalars(select(GpuRow)):
        gpu_counts[gpu.node] = gpu_counts.get(gpu.node, 0) + 1
    busy: dict[str, set[int]] = {}
    for claim in session.scalars(select(GpuClaimRow)):
        busy.setdefault(claim.node, set()).add(claim.gpu_index)
    pending = session.scalars(
        select(JobRow).where(JobRow.state == jobstate.PENDING).order_by(JobRow.created_at, JobRow.id)
    ).all()
    holding = session.scalars(select(JobRow).where(JobRow.state.in_(jobstate.HOLDING_STATES))).all()
    return Snapshot(
        nodes=[NodeFree(n.name, gpu_counts.get(n.name, 0), frozenset(busy.get(n.name, ()))) for n in nodes],
        queue=[QueuedJob(j.id, gpus_to_hold(JobSpecData.from_dict(j.spec))) for j in pending],
        addresses={n.name: n.address for n in nodes},
        holding=list(holding),
    )


def commit_decision(session: Session, decision: Decision, events: Events) -> JobRow | None:
    """Claims the GPUs under a new fencing epoch. None if the job is no longer pending.

    The claims' primary key makes a double booking fail the whole transaction.
    """
    job = get_job(session, decision.job_id, lock=True)
    if job is None or job.state != jobstate.PENDING:
        return None
    epoch = int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
    placement = PlacementRow(job_id=job.id, node=decision.node, gpu_indices=list(decision.gpus), epoch=epoch)
    session.add(placement)
    session.flush()
    for gpu in decision.gpus:
        session.add(GpuClaimRow(node=decision.node, gpu_index=gpu, job_id=job.id, placement_id=placement.id, epoch=epoch))
    job.node, job.gpu_indices, job.epoch = decision.node, list(decision.gpus), epoch
    job.attempts += 1
    job.exit_code, job.error = None, ""
    transition(session, job, jobstate.SCHEDULED, f"placed on {decision.node} GPUs {list(decision.gpus)} (epoch {epoch})", events)
    session.flush()
    return job


def set_waiting_reasons(session: Session, reasons: dict[str, str]) -> None:
    for job_id, reason in reasons.items():
        session.execute(
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.state == jobstate.PENDING, JobRow.reason != reason)
            .values(reason=reason)
        )
