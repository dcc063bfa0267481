"""Who is calling: bearer tokens resolved to an identity (admin, one tenant, or a user of one).

A tenant's own token and a tenant admin's user token administer that tenant (its users,
all its jobs); a plain user's token submits as that user and changes only its own jobs.
"""

from __future__ import annotations

import contextvars
import hashlib
import secrets
from dataclasses import dataclass

from rota.core.errors import InvalidArgument, PermissionDenied

ADMIN = "admin"
TENANT = "tenant"
USER_TOKEN_PREFIX = "ru"  # a user's token: looked up on every call, so a revoked one is refused at once
TENANT_TOKEN_PREFIX = "rt"


@dataclass(frozen=True)
class Identity:
    role: str
    tenant: str = ""
    user: str = ""  # "" for the admin and a tenant's own token
    tenant_admin: bool = False  # a user who administers its tenant

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    @property
    def administers_tenant(self) -> bool:
        """The tenant's own token, or a tenant admin's: its users and all its jobs."""
        return self.role == TENANT and (not self.user or self.tenant_admin)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied("this call needs the admin token")

    def require_tenant_admin(self, tenant: str) -> None:
        """The admin, or an administrator of `tenant` (its own token, or a tenant admin user)."""
        if self.is_admin or (self.tenant == tenant and self.administers_tenant):
            return
        raise PermissionDenied(f"this call needs the admin token or an administrator of tenant {tenant!r}")

    def may_change(self, tenant: str, submitted_by: str | None) -> bool:
        """Whether it may cancel (change) a job: a plain user only its own."""
        if not self.may_access(tenant):
            return False
        return self.is_admin or self.administers_tenant or (submitted_by or "") == self.user

    def may_access(self, tenant: str) -> bool:
        return self.is_admin or self.tenant == tenant

    def tenant_for(self, named: str, verb: str = "submit") -> str:
        """The tenant a job is submitted for (or asked about): a tenant's token decides it
        (a spec naming no tenant is its own; naming another is refused); the admin token
        acts for no tenant, so the spec must name one."""
        if self.is_admin:
            if not named:
                raise InvalidArgument("tenant", f"required with the admin token, which acts for no tenant: name the "
                                                f"tenant to {verb} for (`tenant:` in the job file, or --tenant)")
            return named
        if named and named != self.tenant:
            raise InvalidArgument("tenant", f"a token of tenant {self.tenant!r} cannot {verb} for {named!r}")
        return self.tenant


_current: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("rota_identity", default=None)


def current_identity() -> Identity:
    identity = _current.get()
    if identity is None:  # only reachable if a handler runs without the interceptor
        raise PermissionDenied("no identity for this call")
    return identity


def set_identity(identity: Identity) -> contextvars.Token[Identity | None]:
    return _current.set(identity)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"


def bearer(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return ""
