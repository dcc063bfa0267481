"""The api's Postgres operations on tenants: creation, tokens, quotas (users: `rota.api.users`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from rota.common.models import TenantRow
from rota.common.quotas import tenant_quotas
from rota.core.errors import AlreadyExists, InvalidArgument, NotFound
from rota.core.fairness.quotas import Quota, QuotaError, check_quota


# Tenants.
def create_tenant(
    session: Session, name: str, share: float, token_hash: str, token_expires_at: datetime | None = None,
    quota: Quota | None = None,
) -> TenantRow:
    if session.get(TenantRow, name) is not None:
        raise AlreadyExists(f"tenant {name!r} already exists")
    quota = quota or Quota(name)
    _checked(session, quota)
    tenant = TenantRow(name=name, share=share, token_hash=token_hash, token_expires_at=token_expires_at)
    _apply(tenant, quota)
    session.add(tenant)
    session.flush()
    return tenant


def set_quota(session: Session, quota: Quota) -> TenantRow:
    """A tenant's new quota, checked against every other tenant's (the tree) under a lock on
    the tenants table, so two changes cannot close a cycle between them."""
    session.execute(text("LOCK TABLE tenants IN SHARE ROW EXCLUSIVE MODE"))
    tenant = session.get(TenantRow, quota.tenant)
    if tenant is None:
        raise NotFound(f"tenant {quota.tenant!r} not found")
    _checked(session, quota)
    _apply(tenant, quota)
    session.flush()
    return tenant


def _checked(session: Session, quota: Quota) -> None:
    others = {k: v for k, v in tenant_quotas(session).items() if k != quota.tenant}
    try:
        check_quota(quota, others)
    except QuotaError as exc:
        raise InvalidArgument(exc.field, exc.reason) from exc


def _apply(tenant: TenantRow, quota: Quota) -> None:
    tenant.guaranteed, tenant.gpu_limit = quota.guaranteed, quota.limit
    tenant.gpu_type_limits = dict(quota.type_limits)
    tenant.parent = quota.parent or None


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


