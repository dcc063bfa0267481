"""Engine and session factory; maps connection failures to `Unavailable`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from rota.common.errors import Unavailable

T = TypeVar("T")


def normalize_url(url: str) -> str:
    """Accepts plain `postgresql://` URLs and selects psycopg 3."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


def make_engine(url: str, *, pool_size: int = 5, name: str = "rota") -> Engine:
    """`name` labels the connections in pg_stat_activity as NAME:PID (which process holds what)."""
    return create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=5,
        pool_pre_ping=True,
        pool_recycle=300,
        connect_args={"connect_timeout": 5, "application_name": f"{name}:{os.getpid()}"[:63]},
    )


class Database:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        try:
            with self._sessions.begin() as session:
                yield session
        except OperationalError as exc:
            raise Unavailable(f"database unavailable: {exc.orig}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise Unavailable(f"database connection lost: {exc.orig}") from exc
            raise

    def run(self, fn: Callable[[Session], T]) -> T:
        with self.session() as session:
            return fn(session)
