"""The api's Postgres operations on a tenant's users (`tenant_users`): create, list, revoke, new token."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from rota.common.models import TenantRow, TenantUserRow
from rota.core.errors import AlreadyExists, NotFound


def create_user(session: Session, tenant: str, name: str, tenant_admin: bool, token_hash: str,
                expires_at: datetime | None) -> TenantUserRow:
    if session.get(TenantRow, tenant) is None:
        raise NotFound(f"tenant {tenant!r} not found")
    if session.get(TenantUserRow, (tenant, name)) is not None:
        raise AlreadyExists(f"user {name!r} of tenant {tenant!r} already exists")
    row = TenantUserRow(tenant=tenant, name=name, tenant_admin=tenant_admin, token_hash=token_hash,
                        token_expires_at=expires_at)
    session.add(row)
    session.flush()
    return row


def list_users(session: Session, tenant: str) -> Sequence[TenantUserRow]:
    stmt = select(TenantUserRow).order_by(TenantUserRow.tenant, TenantUserRow.name)
    if tenant:
        stmt = stmt.where(TenantUserRow.tenant == tenant)
    return session.scalars(stmt).all()


def _user(session: Session, tenant: str, name: str) -> TenantUserRow:
    row = session.get(TenantUserRow, (tenant, name), with_for_update=True)
    if row is None:
        raise NotFound(f"user {name!r} of tenant {tenant!r} not found")
    return row


def revoke_user(session: Session, tenant: str, name: str) -> TenantUserRow:
    """Its token matches nothing from now on (idempotent: a revoked user stays revoked as it was)."""
    row = _user(session, tenant, name)
    if row.revoked_at is None:
        row.token_hash, row.revoked_at = None, datetime.now(UTC)
    session.flush()
    return row


def replace_user_token(session: Session, tenant: str, name: str, token_hash: str,
                       expires_at: datetime | None) -> TenantUserRow:
    row = _user(session, tenant, name)
    row.token_hash, row.token_expires_at, row.revoked_at = token_hash, expires_at, None
    session.flush()
    return row
