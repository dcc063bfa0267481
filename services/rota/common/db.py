"""Engine and session factory; maps connection failures to `Unavailable`."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from rota.common import metrics
from rota.core.errors import Unavailable

T = TypeVar("T")
CONNECT_TIMEOUT_S = 5


def normalize_url(url: str) -> str:
    """Accepts plain `postgresql://` URLs and selects psycopg 3."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


def libpq_url(url: str) -> str:
    """The same database as a plain libpq URL, for a direct psycopg connection."""
    return normalize_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


def application_name(name: str) -> str:
    """NAME:PID, as pg_stat_activity shows it (which process holds what)."""
    return f"{name}:{os.getpid()}"[:63]


def make_engine(url: str, *, pool_size: int = 5, name: str = "rota") -> Engine:
    """`name` labels the connections in pg_stat_activity as NAME:PID (which process holds what)."""
    return create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=5,
        pool_pre_ping=True,
        pool_recycle=300,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name(name)},
    )


class TransactionConflict(Unavailable):
    """A serialization failure or a deadlock: the transaction was rolled back and did
    nothing; running it again is safe (and what `run_serializable` does)."""


# SQLSTATEs after which the whole transaction may simply run again.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
SERIALIZABLE_ATTEMPTS = 10
RETRY_BACKOFF_S = 0.005  # doubled per attempt, with jitter, capped at RETRY_BACKOFF_MAX_S
RETRY_BACKOFF_MAX_S = 0.5


def sqlstate(exc: DBAPIError) -> str:
    return str(getattr(exc.orig, "sqlstate", "") or "")


def _error_kind(exc: DBAPIError) -> str:
    """A bounded label for a database error: conflict, unavailable, or the error's class."""
    if sqlstate(exc) in RETRYABLE_SQLSTATES:
        return "conflict"
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        return "unavailable"
    return type(exc).__name__


class Database:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self, *, isolation_level: str = "") -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        try:
            with self._sessions.begin() as session:
                if isolation_level:
                    # Before the first statement: the level is the transaction's from its start
                    # (the pool puts the connection's default back when it is returned).
                    session.connection(execution_options={"isolation_level": isolation_level})
                yield session
        except DBAPIError as exc:
            metrics.POSTGRES_ERRORS.labels(kind=_error_kind(exc)).inc()
            if sqlstate(exc) in RETRYABLE_SQLSTATES:
                raise TransactionConflict(f"transaction conflict, rolled back: {exc.orig}") from exc
            if isinstance(exc, OperationalError):
                raise Unavailable(f"database unavailable: {exc.orig}") from exc
            if exc.connection_invalidated:
                raise Unavailable(f"database connection lost: {exc.orig}") from exc
            raise

    def run(self, fn: Callable[[Session], T]) -> T:
        with self.session() as session:
            return fn(session)

    def run_serializable(
        self, fn: Callable[[Session], T], *, attempts: int = SERIALIZABLE_ATTEMPTS,
        on_retry: Callable[[TransactionConflict], None] | None = None,
    ) -> T:
        """`fn` in a SERIALIZABLE transaction, run again (after a short random backoff) as
        long as PostgreSQL rolls it back for a conflict with a concurrent one. It returns
        only after its commit; after `attempts` conflicts the last one is raised (a
        TransactionConflict, which is UNAVAILABLE to a client: retry later). `fn` must be
        safe to run more than once: every effect it has on the database is rolled back."""
        for attempt in range(1, attempts + 1):
            try:
                with self.session(isolation_level="SERIALIZABLE") as session:
                    return fn(session)
            except TransactionConflict as exc:
                if attempt == attempts:
                    raise
                if on_retry is not None:
                    on_retry(exc)
                # Jitter, so two writers that collided do not collide again in step.
                time.sleep(random.uniform(0.5, 1.0) * min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # the loop returns or raises
