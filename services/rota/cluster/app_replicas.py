"""A realtime app's replicas across nodes: one lease per node, each under its own epoch.

`jobs.replicas` is {node: {"gpus": [...], "epoch": N}}. Each entry is a placement row
and one GPU claim per replica under that epoch, so the claims' primary key keeps two
replicas (of any jobs) off one GPU, a resize on one node closes and opens that node's
lease only (the ledger bills each node's replicas for exactly the time held), and the
other nodes' agents never see their epoch change, so their replica processes go on.
`jobs.node`, `gpu_indices` are the home node's; `jobs.epoch` is the newest lease's.

Functions take an open Session and the job's row lock (the caller's), and never call the
network.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from rota.cluster.job_lifecycle import Events, lose, utcnow
from rota.cluster.models import EPOCH_SEQUENCE, GpuClaimRow, JobRow, PlacementRow
from rota.core import jobstate


@dataclass(frozen=True)
class NodeLease:
    gpus: tuple[int, ...]
    epoch: int


def is_app(job: JobRow) -> bool:
    return job.kind == "realtime"


def leases(job: JobRow) -> dict[str, NodeLease]:
    """Node -> its replicas' lease ({} while the app holds nothing). A row placed before
    replicas were recorded per node is its one node."""
    if job.replicas:
        return {n: NodeLease(tuple(v["gpus"]), int(v["epoch"])) for n, v in job.replicas.items()}
    if job.node and job.state in jobstate.HOLDING_STATES:
        return {job.node: NodeLease(tuple(job.gpu_indices), job.epoch)}
    return {}


def node_epoch(job: JobRow, node: str) -> int:
    """The epoch a report from `node` about `job` must carry: that node's lease's for an app."""
    if is_app(job):
        lease = leases(job).get(node)
        return lease.epoch if lease else -1
    return job.epoch


def claim_node(session: Session, job: JobRow, node: str, gpus: tuple[int, ...]) -> int:
    """A new lease of the app on `node`: a placement and a claim per GPU under a fresh epoch."""
    epoch = int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
    placement = PlacementRow(job_id=job.id, node=node, gpu_indices=list(gpus), epoch=epoch, gang_nodes=[])
    session.add(placement)
    session.flush()
    for gpu in gpus:
        session.add(GpuClaimRow(node=node, gpu_index=gpu, job_id=job.id, placement_id=placement.id, epoch=epoch))
    return epoch


def release_node(session: Session, job: JobRow, node: str, reason: str) -> None:
    """The app's GPUs on `node` freed: its claims there deleted, that node's lease closed."""
    session.execute(delete(GpuClaimRow).where(GpuClaimRow.job_id == job.id, GpuClaimRow.node == node))
    session.execute(
        update(PlacementRow)
        .where(PlacementRow.job_id == job.id, PlacementRow.node == node, PlacementRow.released_at.is_(None))
        .values(released_at=utcnow(), release_reason=reason)
    )


def store(job: JobRow, sets: dict[str, NodeLease]) -> None:
    """Writes the app's leases; its home stays where it is while it has replicas there, else
    moves to the node with the most. An empty `sets` leaves `node` as the last home."""
    job.replicas = {n: {"gpus": list(lease.gpus), "epoch": lease.epoch} for n, lease in sorted(sets.items())}
    if not sets:
        return
    home = job.node if job.node in sets else max(sets, key=lambda n: (len(sets[n].gpus), n))
    job.node, job.gpu_indices = home, list(sets[home].gpus)
    job.epoch = max(lease.epoch for lease in sets.values())


def place(session: Session, job: JobRow, sets: dict[str, tuple[int, ...]], home: str) -> dict[str, NodeLease]:
    """A new app's leases, one per node (`home` first)."""
    job.node = home
    placed = {n: NodeLease(tuple(gpus), claim_node(session, job, n, tuple(gpus)))
              for n, gpus in sorted(sets.items(), key=lambda kv: kv[0] != home)}
    store(job, placed)
    return placed


def resize_node(session: Session, job: JobRow, node: str, gpus: tuple[int, ...]) -> NodeLease | None:
    """One node's new replica set under a new epoch; `gpus` empty: the app leaves the node.
    None (nothing changed) when that would leave the app without a replica."""
    sets = leases(job)
    if not gpus and set(sets) <= {node}:
        return None
    if node in sets:
        release_node(session, job, node, f"resized to {len(gpus)} replicas")
        session.flush()
    lease = NodeLease(tuple(gpus), claim_node(session, job, node, tuple(gpus)) if gpus else 0)
    if gpus:
        sets[node] = lease
    else:
        sets.pop(node, None)
    store(job, sets)
    return lease


def end_node(session: Session, job: JobRow, node: str, why: str, events: Events, *, state: str = "",
             release_reason: str = "node lost") -> bool:
    """The app's replicas on `node` are gone (the node died, or they exited there). True when
    it still serves on other nodes: it stays as it is there. False when `node` held its
    last replicas: the caller ends the job as it would a job on one node."""
    sets = leases(job)
    if node not in sets or set(sets) == {node}:
        return False
    release_node(session, job, node, release_reason)
    del sets[node]
    store(job, sets)
    job.reason = f"{why}; serving on {', '.join(sorted(sets))} ({sum(len(s.gpus) for s in sets.values())} replicas)"
    events.add(job, "resized")
    return True


def lose_on(session: Session, job: JobRow, node: str, why: str, events: Events) -> None:
    """A dead node's part of a job: an app with replicas elsewhere loses that node only; any
    other job (or an app's last node) is lost whole (`job_lifecycle.lose`)."""
    if is_app(job) and end_node(session, job, node, f"{why}: its replicas there were lost", events):
        return
    lose(session, job, why, events, release_reason="node lost", dead_node=node)
