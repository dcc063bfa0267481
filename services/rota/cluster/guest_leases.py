"""Guests in pipeline bubbles (rota.core.planning.guests): the hosts, the commits, the takeovers.

A guest holds `gpu_guests` rows beside its host's `gpu_claims` rows, never instead of
them: the host keeps its GPUs, the planner never sees a guest (it holds no GPU of its
own), and the ledger does not bill it (the host's tenant pays for those GPU-seconds).
When the host ends, the guest takes the GPUs over: in the allocator's next cycle, before
any plan can give them away, its gpu_guests rows become gpu_claims under the same
placement and epoch, so the trial runs on without a restart and is billed from then.
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from rota.cluster.job_lifecycle import Events, get_job, lose, transition, utcnow
from rota.cluster.models import (
    EPOCH_SEQUENCE,
    GpuClaimRow,
    GpuGuestRow,
    GpuRow,
    JobRow,
    NodeRow,
    PlacementRow,
)
from rota.core import jobstate, nodestate
from rota.core.planning.guests import BubbleHost, GuestStart, bubble_fraction, free_memory_mb

log = logging.getLogger(__name__)


def bubble_hosts(session: Session) -> list[BubbleHost]:
    """Running single-node jobs whose last report gives their bubbles, with what they lend."""
    rows = session.execute(
        select(JobRow.id, JobRow.node, JobRow.gpu_indices, JobRow.progress)
        .where(JobRow.state == jobstate.RUNNING, JobRow.guest_of == "", JobRow.node.is_not(None),
               JobRow.gang_nodes == [], JobRow.progress.has_key("bubble_s"))
    ).all()
    hosts = [(job_id, node, gpus, fraction, free_memory_mb(progress or {})) for job_id, node, gpus, progress in rows
             if gpus and (fraction := bubble_fraction(progress or {})) is not None]
    if not hosts:
        return []
    lent: dict[str, set[int]] = {}
    for host_id, gpu in session.execute(select(GpuGuestRow.host_job_id, GpuGuestRow.gpu_index)):
        lent.setdefault(host_id, set()).add(gpu)
    types = {(g.node, g.index): g.gpu_type for g in session.scalars(
        select(GpuRow).where(GpuRow.node.in_(sorted({node for _, node, _, _, _ in hosts}))))}
    return [BubbleHost(job_id, node, tuple(gpus), fraction, frozenset(lent.get(job_id, ())),
                       types.get((node, gpus[0]), ""), free_mb)
            for job_id, node, gpus, fraction, free_mb in hosts]


def live_addresses(session: Session, nodes: set[str]) -> dict[str, str]:
    """The agent address of each of `nodes` that is alive."""
    if not nodes:
        return {}
    rows = session.execute(select(NodeRow.name, NodeRow.address).where(
        NodeRow.name.in_(sorted(nodes)), NodeRow.health == nodestate.ALIVE)).all()
    return {name: address for name, address in rows}


def commit_guest(session: Session, start: GuestStart, events: Events) -> JobRow | None:
    """The trial placed as the host's guest under a new fencing epoch; None when the trial
    is no longer pending or the host no longer runs on those GPUs. The gpu_guests key makes
    a second guest on a GPU fail the whole transaction."""
    job = get_job(session, start.job_id, lock=True)
    host = get_job(session, start.host_job_id, lock=True)
    if job is None or job.state != jobstate.PENDING or host is None or host.state != jobstate.RUNNING:
        return None
    if host.node != start.node or host.guest_of or not set(start.gpus) <= set(host.gpu_indices):
        return None
    epoch = int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
    placement = PlacementRow(job_id=job.id, node=start.node, gpu_indices=list(start.gpus), epoch=epoch,
                             guest_of=host.id)
    session.add(placement)
    session.flush()
    for gpu in start.gpus:
        session.add(GpuGuestRow(node=start.node, gpu_index=gpu, job_id=job.id, host_job_id=host.id,
                                placement_id=placement.id, epoch=epoch))
    job.node, job.gpu_indices, job.epoch, job.guest_of = start.node, list(start.gpus), epoch, host.id
    job.attempts += 1
    job.exit_code, job.error = None, ""
    transition(session, job, jobstate.SCHEDULED,
               f"placed as a guest in the pipeline bubbles of {host.id} on {start.node} GPUs {list(start.gpus)} "
               f"(bubbles {start.bubble_fraction:.0%} of its step; epoch {epoch})", events)
    session.flush()
    return job


def orphaned_guests(session: Session) -> list[str]:
    """Guests whose host no longer holds the GPUs they were lent (it ended, was lost,
    paused or yielded): each is due to take them over."""
    claimed = select(GpuClaimRow.node).where(
        GpuClaimRow.node == GpuGuestRow.node, GpuClaimRow.gpu_index == GpuGuestRow.gpu_index,
        GpuClaimRow.job_id == GpuGuestRow.host_job_id).exists()
    return sorted(set(session.scalars(select(GpuGuestRow.job_id).where(~claimed))))


def take_over(session: Session, job_id: str, events: Events) -> bool:
    """An orphaned guest takes its GPUs over: its gpu_guests rows become gpu_claims under
    the same placement and epoch (its agent keeps it running), billed from now. A GPU
    someone else claimed meanwhile (none should: only the leading allocator claims, and it
    runs this before it plans) loses the guest instead. False when there was nothing to do."""
    job = get_job(session, job_id, lock=True)
    rows = list(session.scalars(select(GpuGuestRow).where(GpuGuestRow.job_id == job_id).with_for_update()))
    if job is None or not rows or job.state not in jobstate.HOLDING_STATES:
        return False
    host = rows[0].host_job_id
    held = session.scalars(select(GpuClaimRow).where(
        GpuClaimRow.node == rows[0].node, GpuClaimRow.gpu_index.in_([r.gpu_index for r in rows]))).all()
    if any(c.job_id == host for c in held):
        return False  # the host still holds (some of) them
    if held:
        log.warning("guest %s lost: GPUs it was lent went to %s", job_id, sorted({c.job_id for c in held}))
        lose(session, job, f"its host {host} ended and its GPUs were given to another job", events,
             release_reason="host ended")
        return True
    session.execute(delete(GpuGuestRow).where(GpuGuestRow.job_id == job_id))
    session.flush()
    for r in rows:
        session.add(GpuClaimRow(node=r.node, gpu_index=r.gpu_index, job_id=job_id, placement_id=r.placement_id,
                                epoch=r.epoch))
    placement = session.get(PlacementRow, rows[0].placement_id)
    if placement is not None:
        placement.promoted_at = utcnow()
    job.guest_of = ""
    events.add(job, "promoted")
    session.flush()
    return True
