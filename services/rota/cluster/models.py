"""The cluster state's schema: jobs, their transitions and arrays, nodes and GPUs, placements,
GPU claims and guests, gang exits. Only `rota.cluster` imports these models (an import
contract in pyproject.toml); every other package reads through `rota.cluster`'s queries or
the views it documents (docs/architecture.md). Migrations in `migrations/` create them.

Postgres is the truth: every job, state change, node, placement and claim lives here.
`gpu_claims` has one row per GPU held by a job, keyed by (node, gpu_index), so the
database itself refuses a double-booked GPU whatever any allocator believes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Sequence,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base

EPOCH_SEQUENCE = Sequence("rota_epoch_seq")


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant", "request_id", name="uq_jobs_tenant_request_id"),
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_node", "node"),
        Index("ix_jobs_array_state", "array_id", "state", postgresql_where=text("array_id IS NOT NULL")),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    gpus: Mapped[int] = mapped_column(Integer, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    spec_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    request_id: Mapped[str | None] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    node: Mapped[str | None] = mapped_column(String(64))
    gpu_indices: Mapped[list[int]] = mapped_column(ARRAY(Integer), nullable=False, server_default="{}")
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    progress: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A gang: its nodes in node-rank order (gang_nodes[0] == node) and its rendezvous.
    gang_nodes: Mapped[list[str]] = mapped_column(ARRAY(String(64)), nullable=False, server_default="{}")
    gang_master: Mapped[str] = mapped_column(String(256), nullable=False, server_default="")
    # A placed realtime app: {node: {"gpus": [...], "epoch": N}}, a lease per node (`node`
    # first); rota.cluster.app_replicas reads and writes it. {} for every other job.
    replicas: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    # A task of a job array (rota.core.arrays): its array and index; None for any other job.
    array_id: Mapped[str | None] = mapped_column(ForeignKey("job_arrays.id"))
    array_index: Mapped[int | None] = mapped_column(Integer)
    # A trial running as a guest in the pipeline bubbles of this host job, on its GPUs
    # (gpu_guests); '' for every other job, and once the guest took the GPUs over.
    guest_of: Mapped[str] = mapped_column(String(32), nullable=False, server_default="")


class JobArrayRow(Base):
    """One array submission; its tasks are jobs whose array_id is its id."""

    __tablename__ = "job_arrays"
    __table_args__ = (UniqueConstraint("tenant", "request_id", name="uq_job_arrays_tenant_request_id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    count: Mapped[int] = mapped_column(Integer, nullable=False)
    max_running: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")  # 0: no cap
    request_id: Mapped[str | None] = mapped_column(String(128))
    spec_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class JobTransitionRow(Base):
    __tablename__ = "job_transitions"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str] = mapped_column(String(16), nullable=False)
    to_state: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(256), nullable=False)
    health: Mapped[str] = mapped_column(String(16), nullable=False)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False, server_default="{}")  # switch, rack
    # What jobs' `cpus` and `memory` may reserve on it, as its agent reported (0: not reported).
    cpus: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    memory_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class GpuRow(Base):
    __tablename__ = "gpus"

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), nullable=False)
    model: Mapped[str] = mapped_column(String(128), nullable=False)
    virtual: Mapped[bool] = mapped_column(Boolean, nullable=False)
    gpu_type: Mapped[str] = mapped_column(String(32), nullable=False, server_default="")


class PlacementRow(Base):
    """Every placement ever committed, with the fencing epoch it was committed under."""

    __tablename__ = "placements"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(64), nullable=False)
    gpu_indices: Mapped[list[int]] = mapped_column(ARRAY(Integer), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    release_reason: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    gang_nodes: Mapped[list[str]] = mapped_column(ARRAY(String(64)), nullable=False, server_default="{}")
    # A guest's placement: its host job, and when (after the host ended) it took the GPUs
    # over. The ledger bills it from promoted_at only (before, the GPUs were the host's).
    guest_of: Mapped[str] = mapped_column(String(32), nullable=False, server_default="")
    promoted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class GpuClaimRow(Base):
    """A GPU held now. The primary key makes a double booking a constraint violation."""

    __tablename__ = "gpu_claims"

    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)


class GpuGuestRow(Base):
    """A GPU lent to a guest trial inside its holder's pipeline bubbles: one guest per GPU
    (the primary key), beside the holder's gpu_claims row, never instead of it."""

    __tablename__ = "gpu_guests"

    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    host_job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)


class GangExitRow(Base):
    """A gang's rank group that ended on one node, under one epoch (the api writes it)."""

    __tablename__ = "gang_exits"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    node: Mapped[str] = mapped_column(String(64), primary_key=True)
    exit_code: Mapped[int] = mapped_column(Integer, nullable=False)
    error: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
