"""Who is calling: bearer tokens resolved to an identity (admin or one tenant)."""

from __future__ import annotations

import contextvars
import hashlib
import secrets
from dataclasses import dataclass

from rota.core.errors import InvalidArgument, PermissionDenied

ADMIN = "admin"
TENANT = "tenant"


@dataclass(frozen=True)
class Identity:
    role: str
    tenant: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    def require_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied("this call needs the admin token")

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
