"""The shared declarative Base, the tenants table and their users (the api's).

Every service's models (and `rota.cluster.models`, the cluster state's) derive from this
one Base, so `migrations/env.py` composes the whole schema in one metadata. Migrations in
`migrations/` create it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TenantRow(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    share: Mapped[float] = mapped_column(Float, nullable=False)
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    token_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # None: never
    # Quotas (docs/tenants.md): GPUs guaranteed, the most it may hold (None: no cap), the most
    # of each GPU type, and the tenant above it in the tree (None: a root).
    guaranteed: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    gpu_type_limits: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    parent: Mapped[str | None] = mapped_column(ForeignKey("tenants.name"))


class TenantUserRow(Base):
    """A user of a tenant: its own token (only the hash is kept), revocable, with its last use."""

    __tablename__ = "tenant_users"

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)  # None: revoked
    token_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    tenant_admin: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="false")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
