"""The api's Postgres operations: tenants, submissions, cancellation, nodes, heartbeats."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from rota.common.models import TenantRow
from rota.core.errors import AlreadyExists, NotFound


# Tenants.
def create_tenant(
    session: Session, name: str, share: float, token_hash: str, token_expires_at: datetime | None = None
) -> TenantRow:
    if session.get(TenantRow, name) is not None:
        raise AlreadyExists(f"tenant {name!r} already exists")
    tenant = TenantRow(name=name, share=share, token_hash=token_hash, token_expires_at=token_expires_at)
    session.add(tenant)
    session.flush()
    return tenant


def replace_token(session: Session, name: str, token_hash: str, token_expires_at: datetime | None) -> TenantRow:
    """The tenant's new token (its old one matches nothing from now on)."""
    tenant = session.get(TenantRow, name, with_for_update=True)
    if tenant is None:
        raise NotFound(f"tenant {name!r} not found")
    tenant.token_hash, tenant.token_expires_at = token_hash, token_expires_at
    session.flush()
    return tenant


def list_tenants(session: Session) -> Sequence[TenantRow]:
    return session.scalars(select(TenantRow).order_by(TenantRow.name)).all()


def tenant_by_token_hash(session: Session, token_hash: str) -> TenantRow | None:
    return session.scalars(select(TenantRow).where(TenantRow.token_hash == token_hash)).first()


