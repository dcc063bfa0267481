"""The api's group commit (rota.api.batcher) on a real PostgreSQL: many submissions in one
statement keep each one's own answer, idempotency holds within a batch and across
concurrent writers (two api processes), and an unreachable database reads UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from submission_builders import job_spec, new_tenant

from rota.api.batcher import SubmitBatcher
from rota.cluster import submissions
from rota.cluster.job_lifecycle import Events, get_job
from rota.cluster.models import JobRow
from rota.common.db import Database, make_engine
from rota.core import jobstate as js
from rota.core.errors import AlreadyExists, InvalidArgument, Unavailable
from rota.core.jobspec import JobSpecData


@pytest.fixture(scope="module")
def db(migrated_database_url: str) -> Iterator[Database]:
    engine = make_engine(migrated_database_url)
    yield Database(engine)
    engine.dispose()


@pytest.fixture
def tenant(db: Database) -> str:
    return new_tenant(db)


def spec(tenant: str, **overrides: Any) -> JobSpecData:
    return job_spec(tenant, **overrides)


def count(db: Database, tenant: str) -> int:
    return int(db.run(lambda s: s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant == tenant))) or 0)


async def submit_all(batcher: SubmitBatcher, items: list[submissions.Submission]) -> list[submissions.Stored | BaseException]:
    # Queued in one loop iteration: they go to the database together.
    return await asyncio.gather(*(batcher.submit(item) for item in items), return_exceptions=True)


def test_one_batch_gives_each_submission_its_own_answer(migrated_database_url: str, db: Database, tenant: str) -> None:
    ghost = "ghost-" + secrets.token_hex(4)
    items = [
        submissions.Submission(spec(tenant), "a"),
        submissions.Submission(spec(tenant), ""),
        submissions.Submission(spec(ghost), "g"),  # unknown tenant: only this one fails
        submissions.Submission(spec(tenant), "a"),  # same request id, same body: the first job
        submissions.Submission(spec(tenant, gpus=2), "a"),  # same request id, another body
        submissions.Submission(spec(tenant), ""),
    ]
    batcher = SubmitBatcher(migrated_database_url)
    results = asyncio.run(submit_all(batcher, items))

    first, plain, unknown, again, other, plain2 = results
    assert batcher.batches == 1 and batcher.submissions == len(items)
    assert isinstance(first, submissions.Stored) and first.created and first.created_at is not None
    assert isinstance(plain, submissions.Stored) and plain.created
    assert isinstance(plain2, submissions.Stored) and plain2.created and plain2.job_id != plain.job_id
    assert isinstance(unknown, InvalidArgument) and unknown.field == "tenant"
    assert isinstance(again, submissions.Stored) and (again.job_id, again.created) == (first.job_id, False)
    assert isinstance(other, AlreadyExists) and first.job_id in str(other)
    assert count(db, tenant) == 3 and count(db, ghost) == 0
    job = db.run(lambda s: get_job(s, first.job_id))
    assert job is not None and (job.state, job.reason, job.request_id) == (js.PENDING, "submitted", "a")
    assert job.spec_hash == items[0].spec.digest() and job.spec == items[0].spec.to_dict()


def test_a_retry_in_a_later_batch_returns_the_first_job(migrated_database_url: str, db: Database, tenant: str) -> None:
    batcher = SubmitBatcher(migrated_database_url)

    async def twice() -> tuple[submissions.Stored, submissions.Stored]:
        first = await batcher.submit(submissions.Submission(spec(tenant), "retry-me"))
        again = await batcher.submit(submissions.Submission(spec(tenant), "retry-me"))
        return first, again

    first, again = asyncio.run(twice())
    assert first.created and not again.created and again.job_id == first.job_id
    # The session path (tests and tools) agrees with the batch writer.
    job, created = db.run(lambda s: submissions.submit_job(s, spec(tenant), "retry-me", Events()))
    assert (job.id, created) == (first.job_id, False)


def test_concurrent_writers_store_each_request_id_once(migrated_database_url: str, db: Database, tenant: str) -> None:
    """Two batchers (as two api processes) race with the same request ids in opposite
    orders: every id is stored once and both writers answer with that one job."""
    ids = [f"race-{i}" for i in range(40)]

    async def race() -> tuple[list[submissions.Stored | BaseException], list[submissions.Stored | BaseException]]:
        a, b = SubmitBatcher(migrated_database_url), SubmitBatcher(migrated_database_url)
        return await asyncio.gather(
            submit_all(a, [submissions.Submission(spec(tenant), r) for r in ids]),
            submit_all(b, [submissions.Submission(spec(tenant), r) for r in reversed(ids)]),
        )

    left, right = asyncio.run(race())
    assert all(isinstance(r, submissions.Stored) for r in left + right), [r for r in left + right if not isinstance(r, submissions.Stored)]
    by_id_left = {r: s.job_id for r, s in zip(ids, left, strict=True) if isinstance(s, submissions.Stored)}
    by_id_right = {r: s.job_id for r, s in zip(reversed(ids), right, strict=True) if isinstance(s, submissions.Stored)}
    assert by_id_left == by_id_right
    assert sum(1 for s in left + right if isinstance(s, submissions.Stored) and s.created) == len(ids)
    assert count(db, tenant) == len(ids)


def test_an_unreachable_database_is_unavailable(tenant: str) -> None:
    # Nothing listens on port 1: the connection is refused at once.
    batcher = SubmitBatcher("postgresql://postgres@127.0.0.1:1/none")
    [result] = asyncio.run(submit_all(batcher, [submissions.Submission(spec(tenant), "x")]))
    assert isinstance(result, Unavailable)
