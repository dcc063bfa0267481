"""Reads of the cluster state that other packages need.

Rows come back as `rota.cluster.models` objects under the names below (`Job`, `Node`, ...):
callers read their attributes and never change them (an import contract keeps every
other package off the models; `tests/unit/test_cluster_ownership.py` keeps writes of the
cluster tables inside rota.cluster). Plain columns come back as tuples or dicts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from rota.cluster.models import (
    GpuClaimRow,
    GpuRow,
    JobArrayRow,
    JobRow,
    JobTransitionRow,
    NodeRow,
    PlacementRow,
)
from rota.core import jobstate

# The rows' types, for callers' annotations (read-only to them).
Job = JobRow
JobArray = JobArrayRow
Transition = JobTransitionRow
Node = NodeRow
Gpu = GpuRow
Claim = GpuClaimRow


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


def list_jobs(session: Session, tenant: str, states: Sequence[str], limit: int, user: str = "") -> Sequence[JobRow]:
    stmt = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.array_index, JobRow.id).limit(limit)
    if tenant:
        stmt = stmt.where(JobRow.tenant == tenant)
    if states:
        stmt = stmt.where(JobRow.state.in_(states))
    if user:  # `rota jobs --mine`
        stmt = stmt.where(JobRow.submitted_by == user)
    return session.scalars(stmt).all()


def guests_of(session: Session, host_id: str, tenant: str = "") -> list[str]:
    """The trials running as guests in the host's bubbles now; only `tenant`'s when given."""
    stmt = select(JobRow.id).where(JobRow.guest_of == host_id, JobRow.state.in_(jobstate.HOLDING_STATES))
    if tenant:
        stmt = stmt.where(JobRow.tenant == tenant)
    return list(session.scalars(stmt.order_by(JobRow.id)).all())


def array_tasks(session: Session, array_id: str) -> tuple[JobArray, list[tuple[str, str, int, int]]] | None:
    """An array and its tasks grouped by (state, reason): each group's count and lowest task
    index; None when no array has that id."""
    row = session.get(JobArrayRow, array_id)
    if row is None:
        return None
    groups = session.execute(
        select(JobRow.state, JobRow.reason, func.count(), func.min(JobRow.array_index))
        .where(JobRow.array_id == array_id).group_by(JobRow.state, JobRow.reason)
    ).all()
    return row, [(state, reason or "", n, first or 0) for state, reason, n, first in groups]


# Nodes.
def job_tenants(session: Session, job_ids: set[str]) -> dict[str, str]:
    """Each job's tenant (jobs that are gone are absent)."""
    if not job_ids:
        return {}
    return dict(session.execute(select(JobRow.id, JobRow.tenant).where(JobRow.id.in_(sorted(job_ids)))).all())


def held_gpus_by_tenant(session: Session) -> dict[str, int]:
    """GPUs each tenant's jobs hold now (claims; a guest's borrowed GPUs are its host's)."""
    stmt = (select(JobRow.tenant, func.count()).select_from(GpuClaimRow)
            .join(JobRow, JobRow.id == GpuClaimRow.job_id).group_by(JobRow.tenant))
    return {str(t): int(n) for t, n in session.execute(stmt).all()}


def list_nodes(session: Session) -> list[tuple[NodeRow, Sequence[GpuRow], Sequence[GpuClaimRow]]]:
    nodes = session.scalars(select(NodeRow).order_by(NodeRow.name)).all()
    gpus = session.scalars(select(GpuRow)).all()
    claims = session.scalars(select(GpuClaimRow)).all()
    return [
        (n, [g for g in gpus if g.node == n.name], [c for c in claims if c.node == n.name]) for n in nodes
    ]


def running_jobs(session: Session) -> list[tuple[str, str | None, int, datetime | None]]:
    """Every RUNNING job: (id, node, epoch, started_at)."""
    rows = session.execute(select(JobRow.id, JobRow.node, JobRow.epoch, JobRow.started_at)
                           .where(JobRow.state == jobstate.RUNNING)).all()
    return list(rows)


def finished_before(cutoff: datetime) -> Select[Any]:
    """The ids of the jobs that ended before `cutoff` (a subquery for the caller's statement)."""
    return select(JobRow.id).where(JobRow.state.in_(jobstate.FINAL_STATES), JobRow.finished_at < cutoff)


def tenant_job_ids(tenant: str) -> Select[Any]:
    """The ids of `tenant`'s jobs (a subquery for the caller's statement)."""
    return select(JobRow.id).where(JobRow.tenant == tenant)


def placement_at(session: Session, job_id: str, epoch: int) -> tuple[str, tuple[int, ...]] | None:
    """(node, GPUs) of the job's placement under `epoch`; None if there was none."""
    row = session.execute(select(PlacementRow.node, PlacementRow.gpu_indices)
                          .where(PlacementRow.job_id == job_id, PlacementRow.epoch == epoch).limit(1)).first()
    return (row[0], tuple(row[1])) if row is not None else None


# Nodes.
def get_node(session: Session, name: str) -> NodeRow | None:
    return session.get(NodeRow, name)


def node_addresses(session: Session, names: Sequence[str]) -> dict[str, str]:
    """Each registered node's agent address (unknown names are absent)."""
    if not names:
        return {}
    return dict(session.execute(select(NodeRow.name, NodeRow.address)
                                .where(NodeRow.name.in_(sorted(set(names))))).all())


def cluster_counts(session: Session) -> dict[str, Any]:
    """What the api's metrics export, in grouped reads: jobs by (state, kind, tenant), GPUs
    and claims per node, each node's (name, health, last heartbeat), running jobs' progress (in id order)."""
    return {
        "jobs": session.execute(select(JobRow.state, JobRow.kind, JobRow.tenant, func.count())
                                .group_by(JobRow.state, JobRow.kind, JobRow.tenant)).all(),
        "gpus": dict(session.execute(select(GpuRow.node, func.count()).group_by(GpuRow.node)).all()),
        "claimed": dict(session.execute(select(GpuClaimRow.node, func.count())
                                        .group_by(GpuClaimRow.node)).all()),
        "nodes": session.execute(select(NodeRow.name, NodeRow.health, NodeRow.last_heartbeat)).all(),
        "running": session.execute(select(JobRow.id, JobRow.tenant, JobRow.kind, JobRow.progress)
                                   .where(JobRow.state == jobstate.RUNNING).order_by(JobRow.id)).all(),
    }
