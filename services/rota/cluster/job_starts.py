"""Starts and resizes: claims under a new fencing epoch, in the allocator's one transaction.

`commit_decision` inserts the placement and its `gpu_claims` (primary key (node,
gpu_index): the database refuses a double booking) and moves the job to SCHEDULED; the
caller commits, then calls the agents. A guest's start and takeover: `guest_leases`."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from rota.cluster import app_replicas
from rota.cluster.job_lifecycle import (
    Events,
    get_job,
    nodes_of,
    release,
    transition,
    unplace,
)
from rota.cluster.models import (
    EPOCH_SEQUENCE,
    GpuClaimRow,
    JobRow,
    NodeRow,
    PlacementRow,
)
from rota.core import jobstate, nodestate
from rota.core.planning.liveplan import Start


def commit_decision(session: Session, decision: Start, events: Events) -> JobRow | None:
    """Claims the GPUs under a new fencing epoch. None if the job is no longer pending.

    The claims' primary key makes a double booking fail the whole transaction.
    """
    job = get_job(session, decision.job_id, lock=True)
    if job is None or job.state != jobstate.PENDING:
        return None
    if app_replicas.is_app(job):  # a lease per node, each under its own epoch
        sets = dict(decision.replicas) or {decision.node: decision.gpus}
        epoch = max(lease.epoch for lease in app_replicas.place(session, job, sets, decision.node).values())
    else:
        epoch = _claim(session, job, decision)
    job.attempts += 1
    job.exit_code, job.error = None, ""
    where = f"on {decision.node} GPUs {list(decision.gpus)}"
    if len(decision.replicas) > 1:
        where = "with replicas on " + ", ".join(f"{n} GPUs {list(g)}" for n, g in decision.replicas)
    if decision.nodes:
        where = f"as a gang on {len(decision.nodes)} nodes ({', '.join(decision.nodes)}) x GPUs {list(decision.gpus)}"
    transition(session, job, jobstate.SCHEDULED, f"placed {where} (epoch {epoch})", events)
    session.flush()
    return job


GANG_PORT_BASE = 20000  # MASTER_PORT of a gang: ours, chosen per epoch in [base, base + span)


GANG_PORT_SPAN = 20000


def gang_master(session: Session, first_node: str, epoch: int) -> str:
    """host:port of a gang's rendezvous: node rank 0's host (its agent's advertised
    address), and a port that changes with every placement, so a restarted gang never
    meets a previous attempt's ranks; two gangs led from one host collide only when their
    epochs are GANG_PORT_SPAN apart, and then the rendezvous fails and the gang restarts."""
    address = session.scalar(select(NodeRow.address).where(NodeRow.name == first_node)) or "127.0.0.1:0"
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return f"{host}:{GANG_PORT_BASE + epoch % GANG_PORT_SPAN}"


def _claim(session: Session, job: JobRow, where: Start) -> int:
    """A new lease: a placement and one claim per GPU under a fresh epoch, which it returns."""
    epoch = next_epoch(session)
    nodes = list(where.nodes)  # a gang: every node of it, under the one epoch
    placement = PlacementRow(job_id=job.id, node=where.node, gpu_indices=list(where.gpus), epoch=epoch, gang_nodes=nodes)
    session.add(placement)
    session.flush()
    for node in nodes or [where.node]:
        for gpu in where.gpus:
            session.add(GpuClaimRow(node=node, gpu_index=gpu, job_id=job.id, placement_id=placement.id, epoch=epoch))
    job.node, job.gpu_indices, job.epoch = where.node, list(where.gpus), epoch
    job.gang_nodes = nodes
    job.gang_master = gang_master(session, where.node, epoch) if nodes else ""
    return epoch


# One statement for the whole queue; rows whose reason is unchanged are not rewritten.
SET_REASONS_SQL = text("""
UPDATE jobs SET reason = v.reason
FROM unnest(CAST(:ids AS text[]), CAST(:reasons AS text[])) AS v(id, reason)
WHERE jobs.id = v.id AND jobs.state = :pending AND jobs.reason IS DISTINCT FROM v.reason
""")


def set_waiting_reasons(session: Session, reasons: dict[str, str]) -> None:
    """Each waiting job's reason, written only where it changed, in one statement.

    With thousands queued (a burst of submissions) a statement per job would cost the
    plan a round trip each, and rewrite rows the api is inserting beside.
    """
    if reasons:
        session.execute(SET_REASONS_SQL, {"ids": list(reasons), "reasons": list(reasons.values()),
                                          "pending": jobstate.PENDING})


def fail_unsatisfiable(session: Session, doomed: dict[str, str], events: Events) -> list[str]:
    """Waiting jobs whose dependency can no longer hold go FAILED with the reason; a job no
    longer PENDING is left as it is, so a repeated call (or a second leader's) changes nothing."""
    failed: list[str] = []
    for job_id in sorted(doomed):
        job = get_job(session, job_id, lock=True)
        if job is None or job.state != jobstate.PENDING:
            continue
        job.error = doomed[job_id]
        transition(session, job, jobstate.FAILED, doomed[job_id], events)
        failed.append(job_id)
    return failed


@dataclass(frozen=True)
class Resized:
    """A committed resize of one node of a realtime app: what that node's agent is told."""

    job: JobRow
    node: str
    gpus: tuple[int, ...]  # empty: the app left the node
    epoch: int  # the node's new lease (0 when it left)
    previous_epoch: int  # the node's lease before (0: the app was not there: a launch)


def commit_resize(session: Session, resize: Start, events: Events) -> Resized | None:
    """A realtime app's new GPU set on one node, under a new epoch for that node only; an
    empty set: it leaves the node; a node it is not on: it grows there. None if it moved on,
    the node is not live, or the app would be left without a replica.

    That node's lease closes and a new one opens, so the ledger bills each node's replicas
    for exactly the time they were held; the other nodes' leases are untouched.
    """
    job = get_job(session, resize.job_id, lock=True)
    if job is None or job.state not in jobstate.HOLDING_STATES or not app_replicas.is_app(job) or job.node is None:
        return None
    before = app_replicas.leases(job).get(resize.node)
    if before is None and not resize.gpus:
        return None  # it is not there to leave
    if before is None and session.scalar(
            select(NodeRow.health).where(NodeRow.name == resize.node)) != nodestate.ALIVE:
        return None
    lease = app_replicas.resize_node(session, job, resize.node, resize.gpus)
    if lease is None:
        return None
    events.add(job, "resized")
    session.flush()
    return Resized(job, resize.node, lease.gpus, lease.epoch, before.epoch if before else 0)


def yield_lease(session: Session, job_id: str, reason: str, events: Events) -> tuple[list[str], int] | None:
    """A running job gives its GPUs back and waits again (docs/design.md §4 lease expiry).

    Returns (nodes, epoch) to stop it at (a gang's every node), or None if it no longer holds GPUs. Only jobs that
    restart on failure are asked to yield, so requeueing them loses no more than a restart.
    """
    job = get_job(session, job_id, lock=True)
    if job is None or job.state not in jobstate.HOLDING_STATES or job.node is None:
        return None
    nodes, epoch = nodes_of(job), job.epoch
    release(session, job, "lease yielded")
    transition(session, job, jobstate.PENDING, reason, events)
    unplace(job)
    return nodes, epoch


def next_epoch(session: Session) -> int:
    """A fresh fencing epoch (one sequence numbers placements and plan steps alike)."""
    return int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
