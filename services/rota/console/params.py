"""Pure request handling of the console: query parameters, errors as HTTP statuses, the
form token that guards every POST.

A bad parameter is a 400 naming the field; the api's own refusals keep its status (an
unknown job is NOT_FOUND, hence 404) and its message, never a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rota.client.enums import JobKind, JobState

STATES = tuple(s.value for s in JobState)
KINDS = tuple(k.value for k in JobKind)
MAX_LIMIT = 1000
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


class BadParameter(ValueError):
    """A request parameter the console refuses: HTTP 400 naming `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class JobFilters:
    tenant: str = ""
    states: tuple[JobState, ...] = ()
    kinds: tuple[JobKind, ...] = ()
    limit: int = 200

    def query(self) -> str:
        """The filters as a query string (for links that keep them)."""
        parts = [f"tenant={self.tenant}"] if self.tenant else []
        parts += [f"state={s}" for s in self.states] + [f"kind={k}" for k in self.kinds]
        return "&".join(parts)


def _values(query: Mapping[str, Sequence[str]], name: str) -> list[str]:
    """Every value of a repeatable parameter; "a,b" counts as two; blanks are dropped."""
    return [v.strip() for raw in query.get(name, ()) for v in raw.split(",") if v.strip()]


def job_filters(query: Mapping[str, Sequence[str]]) -> JobFilters:
    """/jobs?tenant=T&state=RUNNING&state=PENDING&kind=training&limit=50 (parse_qs's shape)."""
    unknown = sorted(set(query) - {"tenant", "state", "kind", "limit"})
    if unknown:
        raise BadParameter(unknown[0], "unknown parameter (filters: tenant, state, kind, limit)")
    tenants = _values(query, "tenant")
    if len(tenants) > 1:
        raise BadParameter("tenant", "give one tenant")
    tenant = tenants[0] if tenants else ""
    if len(tenant) > 64 or not set(tenant) <= NAME_CHARS:
        raise BadParameter("tenant", "1-64 letters, digits, '-' or '_'")
    state_names = tuple(dict.fromkeys(s.upper() for s in _values(query, "state")))
    for s in state_names:
        if s not in STATES:
            raise BadParameter("state", f"one of {', '.join(STATES)} (got {s!r})")
    kind_names = tuple(dict.fromkeys(k.lower() for k in _values(query, "kind")))
    for k in kind_names:
        if k not in KINDS:
            raise BadParameter("kind", f"one of {', '.join(KINDS)} (got {k!r})")
    states = tuple(JobState(s) for s in state_names)
    kinds = tuple(JobKind(k) for k in kind_names)
    limit = 200
    raw_limit = _values(query, "limit")
    if raw_limit:
        if len(raw_limit) > 1 or not raw_limit[0].isdigit() or not 1 <= int(raw_limit[0]) <= MAX_LIMIT:
            raise BadParameter("limit", f"a whole number from 1 to {MAX_LIMIT}")
        limit = int(raw_limit[0])
    return JobFilters(tenant, states, kinds, limit)


def job_id(raw: str) -> str:
    """A job id from a path segment: what the api accepts as an id, else a 400."""
    if not raw or len(raw) > 64 or not set(raw) <= NAME_CHARS:
        raise BadParameter("id", "a job id such as j-1234567890")
    return raw


# The api's status codes (RotaError.code) as HTTP statuses.
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}


def http_status(code: str) -> int:
    """The HTTP status of an api error code; anything else is a bad gateway (502)."""
    return HTTP_STATUS.get(code, 502)


def error_text(code: str, message: str, field: str = "") -> str:
    """One line for the error page: the api's message, with the field it names."""
    if field and not message.startswith(field):
        message = f"{field}: {message}"
    return f"{code}: {message}"


def form_token(token: str) -> str:
    """The form token of a session: derived from its bearer token, so it needs no state on
    the server (any console replica checks it), and a page of another site, which cannot
    read the cookie, cannot forge it."""
    return hashlib.sha256(b"rota-console-form\0" + token.encode()).hexdigest()[:32]


def form_token_ok(token: str, given: str) -> bool:
    return bool(token) and hmac.compare_digest(form_token(token), given)
