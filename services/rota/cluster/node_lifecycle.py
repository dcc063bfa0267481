"""The node lifecycle: the only writer of `nodes.health` and `nodes.last_heartbeat`.

Register and beat (the api, on an agent's calls), drain (the detector, on `rota drain`),
declare dead (the leading allocator, every cycle) and the api's restart grace all go
through here, in the caller's transaction. The rules are `rota.core.nodestate`'s, and one
clock decides a death: the database's `now()`, which stamps every heartbeat and is the
deadline's reference, so no process's own clock (or its skew) enters. A dead node's jobs
are lost through `job_lifecycle.lose`, the same path as a silent rank's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from rota.cluster import app_replicas, gang_reports
from rota.cluster.job_lifecycle import Events, on_node
from rota.cluster.models import GpuClaimRow, GpuRow, JobRow, NodeRow
from rota.core import jobstate, nodestate
from rota.core.errors import NotFound


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as its node's agent reports it at registration."""

    index: int
    uuid: str
    model: str
    virtual: bool
    gpu_type: str = ""


def register(
    session: Session, name: str, address: str, gpus: Sequence[GpuInfo], labels: Mapping[str, str] | None = None,
    capacity: tuple[float, int] = (0.0, 0),
) -> NodeRow:
    """A node's agent (re)starts: the node is ALIVE (a drain outlives the restart), its GPUs
    (with their types) and its labels are the ones it reports now: a node moved to another
    switch, or given other GPUs, says so by restarting its agent."""
    node = session.get(NodeRow, name, with_for_update=True)
    if node is None:
        node = NodeRow(name=name, address=address, health=nodestate.ALIVE, last_heartbeat=func.now(),
                       labels=dict(labels or {}), cpus=capacity[0], memory_bytes=capacity[1])
        session.add(node)
    else:
        target = nodestate.after_beat(node.health)
        nodestate.check(node.health, target)
        node.address, node.health, node.last_heartbeat = address, target, func.now()
        node.labels = dict(labels or {})
        node.cpus, node.memory_bytes = capacity
    session.flush()
    existing = {g.index: g for g in session.scalars(select(GpuRow).where(GpuRow.node == name))}
    for gpu in gpus:
        row = existing.pop(gpu.index, None)
        if row is None:
            session.add(GpuRow(node=name, index=gpu.index, uuid=gpu.uuid, model=gpu.model, virtual=gpu.virtual,
                               gpu_type=gpu.gpu_type or ""))
        else:
            row.uuid, row.model, row.virtual, row.gpu_type = gpu.uuid, gpu.model, gpu.virtual, gpu.gpu_type or ""
    for stale in existing.values():
        session.delete(stale)
    return node  # last_heartbeat, stamped by the database's clock, loads when it is read


def beat(session: Session, name: str) -> NodeRow:
    """A heartbeat: stamped with the database's clock, a DEAD node back to ALIVE; the row
    stays locked to the end of the caller's transaction (one statement: UPDATE ... RETURNING)."""
    back = case((NodeRow.health == nodestate.DEAD, nodestate.after_beat(nodestate.DEAD)), else_=NodeRow.health)
    node = session.scalars(
        update(NodeRow).where(NodeRow.name == name).values(last_heartbeat=func.now(), health=back)
        .returning(NodeRow).execution_options(populate_existing=True, synchronize_session=False)
    ).first()
    if node is None:
        raise NotFound(f"node {name} is not registered")
    return node


def drain(session: Session, name: str, *, undo: bool) -> tuple[str, int]:
    """Marks a node DRAINING (or ALIVE again); returns its health and how many jobs still run there."""
    node = session.get(NodeRow, name, with_for_update=True)
    if node is None:
        raise NotFound(f"node {name} is not registered")
    target = nodestate.after_drain(node.health, undo=undo, node=name)
    nodestate.check(node.health, target)
    node.health = target
    running = session.scalar(
        select(func.count()).select_from(JobRow).where(on_node(name), JobRow.state.in_(jobstate.HOLDING_STATES))
    )
    return node.health, int(running or 0)


@dataclass(frozen=True)
class StrandedCopy:
    """A process of a lost job that may still run on `node` (dialled at `address`) under `epoch`."""

    node: str
    address: str
    job_id: str
    epoch: int


@dataclass(frozen=True)
class DeadNode:
    """A node just declared dead, with the copies of its lost jobs that may still run.

    Silence is not proof of death: a node cut off from the api (a partition) still runs its
    jobs, and its agent's lease (the launchers' fence) stays fresh while the agent lives. A
    lost gang's ranks on its other, live nodes run on too until their agents' next
    heartbeats. The allocator stops every such copy before it places those jobs again."""

    name: str
    copies: tuple[StrandedCopy, ...]


def declare_dead(session: Session, timeout_s: float, events: Events) -> list[str]:
    """The names of the nodes `declare_dead_nodes` declares dead."""
    return [dead.name for dead in declare_dead_nodes(session, timeout_s, events)]


def declare_dead_nodes(session: Session, timeout_s: float, events: Events) -> list[DeadNode]:
    """Nodes silent past the timeout (on the database's clock) become DEAD; their jobs are
    lost: restored from their last image elsewhere, or requeued or failed by their restart policy.
    A realtime app with replicas on other nodes loses this node's replicas only and serves on."""
    silent_s = func.extract("epoch", func.now() - NodeRow.last_heartbeat)
    rows = session.execute(
        select(NodeRow, silent_s)
        .where(NodeRow.health.in_(nodestate.BEATING), NodeRow.last_heartbeat < func.now() - timedelta(seconds=timeout_s))
        .with_for_update(of=NodeRow)
    ).all()
    dead: list[DeadNode] = []
    for node, silent in rows:
        nodestate.check(node.health, nodestate.DEAD)
        node.health = nodestate.DEAD
        # Its jobs, and every gang with a node here: the whole gang stops together; an app's
        # replicas here only (the next plan places them again on live nodes).
        jobs = session.scalars(
            select(JobRow).where(on_node(node.name),
                                 JobRow.state.in_(jobstate.HOLDING_STATES)).with_for_update()
        ).all()
        # Where each may still run, under the epoch it was placed with (read before it is
        # lost): a gang on every one of its nodes, anything else (an app's replicas too) here.
        where = {job.id: list(job.gang_nodes) or [node.name] for job in jobs}
        addresses = _addresses(session, {n for nodes in where.values() for n in nodes})
        copies = tuple(StrandedCopy(n, addresses[n], job.id, job.epoch)
                       for job in jobs for n in where[job.id] if n in addresses)
        for job in jobs:
            gang = f" (node of its {len(job.gang_nodes)}-node gang)" if job.gang_nodes else ""
            app_replicas.lose_on(session, job, node.name, f"node {node.name}{gang} missed heartbeats for {float(silent):.1f}s",
                             events)
        # A stopped gang's ranks that may still run here: their claims go with the node.
        stopping = gang_reports.stopping_claims(session, node.name)
        if stopping:
            session.execute(delete(GpuClaimRow).where(GpuClaimRow.node == node.name,
                                                      GpuClaimRow.job_id.in_([j for j, _ in stopping])))
            address = _addresses(session, {node.name}).get(node.name)
            copies += tuple(StrandedCopy(node.name, address, j, e) for j, e in stopping if address)
        dead.append(DeadNode(node.name, copies))
    return dead


def _addresses(session: Session, names: set[str]) -> dict[str, str]:
    rows = session.execute(select(NodeRow.name, NodeRow.address).where(NodeRow.name.in_(names))).all() if names else []
    return {name: address for name, address in rows}


def grant_restart_grace(session: Session) -> None:
    """Heartbeats could not arrive while the api was down: every beating node gets a full
    timeout from now before it can be declared dead."""
    session.execute(update(NodeRow).where(NodeRow.health.in_(nodestate.BEATING)).values(last_heartbeat=func.now()))
