"""Reads of the cluster state that other packages need, as rows of `rota.cluster.models`
(callers use the rows' attributes; only rota.cluster imports the models)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rota.cluster.models import (
    GpuClaimRow,
    GpuRow,
    JobRow,
    NodeRow,
)
from rota.core import jobstate


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
