"""Tenant tokens on a real PostgreSQL: expiry enforced at every call, replacement."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from datetime import timedelta

import pytest

from rota.api import repository as api
from rota.cluster.job_lifecycle import utcnow
from rota.common.auth import TENANT, Identity, hash_token
from rota.common.bootstrap import TokenAuthenticator
from rota.common.db import Database, make_engine
from rota.core.errors import NotFound, Unauthenticated

ADMIN_TOKEN = "admin-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def db(migrated_database_url: str) -> Iterator[Database]:
    engine = make_engine(migrated_database_url)
    yield Database(engine)
    engine.dispose()


def tenant_with_token(db: Database, expires_in: timedelta | None) -> tuple[str, str]:
    name, token = "t-" + secrets.token_hex(3), "rt_" + secrets.token_hex(16)
    expires_at = None if expires_in is None else utcnow() + expires_in
    db.run(lambda s: api.create_tenant(s, name, 1.0, hash_token(token), expires_at))
    return name, token


def test_a_token_past_its_expiry_is_refused_and_one_before_it_names_its_tenant(db: Database) -> None:
    auth = TokenAuthenticator(ADMIN_TOKEN, db)
    lasting, lasting_token = tenant_with_token(db, timedelta(hours=1))
    _expired, expired_token = tenant_with_token(db, timedelta(seconds=-1))
    forever, forever_token = tenant_with_token(db, None)

    async def run() -> None:
        assert await auth(lasting_token) == Identity(TENANT, lasting)
        assert await auth(forever_token) == Identity(TENANT, forever)
        with pytest.raises(Unauthenticated, match="expired"):
            await auth(expired_token)
        with pytest.raises(Unauthenticated, match="expired"):  # a second time, from the cache
            await auth(expired_token)
        assert await auth("rt_" + secrets.token_hex(16)) is None

    asyncio.run(run())


def test_a_replaced_token_matches_nothing_and_the_new_one_carries_its_own_expiry(db: Database) -> None:
    name, old = tenant_with_token(db, None)
    new = "rt_" + secrets.token_hex(16)
    row = db.run(lambda s: api.replace_token(s, name, hash_token(new), utcnow() + timedelta(minutes=5)))
    assert row.token_expires_at is not None
    auth = TokenAuthenticator(ADMIN_TOKEN, db)

    async def run() -> tuple[Identity | None, Identity | None]:
        return await auth(old), await auth(new)

    assert asyncio.run(run()) == (None, Identity(TENANT, name))
    with pytest.raises(NotFound):
        db.run(lambda s: api.replace_token(s, "t-missing-" + secrets.token_hex(3), hash_token(new), None))
