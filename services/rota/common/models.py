"""The shared declarative Base and the tenants table (the api's).

Every service's models (and `rota.cluster.models`, the cluster state's) derive from this
one Base, so `migrations/env.py` composes the whole schema in one metadata. Migrations in
`migrations/` create it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, String, func
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
