"""The tenants' quotas as the core's rules read them (the api writes them, the allocator plans with them)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from rota.common.models import TenantRow
from rota.core.fairness.quotas import Quota


def quota_of(row: TenantRow) -> Quota:
    limits = tuple(sorted((str(k), int(v)) for k, v in (row.gpu_type_limits or {}).items()))
    return Quota(row.name, row.guaranteed or 0, row.gpu_limit, row.parent or "", limits)


def tenant_quotas(session: Session) -> dict[str, Quota]:
    """Every tenant's quota, by name (a bare tenant's says nothing: `Quota.configured` is False)."""
    return {row.name: quota_of(row) for row in session.scalars(select(TenantRow))}
