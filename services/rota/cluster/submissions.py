"""Submissions: single jobs and group-committed batches, stored PENDING in one statement.

The api validates the spec; these functions write the rows, in the caller's transaction
(`submit_jobs`, `submit_job`) or on the api batch writer's autocommit connection
(`store_batch`: the group commit). An array's tasks: `rota.cluster.job_arrays`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import select
from sqlalchemy.orm import Session

from rota.cluster.job_lifecycle import (
    Events,
    new_job_id,
)
from rota.cluster.models import (
    JobRow,
)
from rota.core import jobstate
from rota.core.errors import AlreadyExists, DomainError, InvalidArgument
from rota.core.jobspec import JobSpecData


def find_by_request_id(session: Session, tenant: str, request_id: str) -> JobRow | None:
    stmt = select(JobRow).where(JobRow.tenant == tenant, JobRow.request_id == request_id)
    return session.scalars(stmt).first()


@dataclass
class Submission:
    """One validated submission; `body` is the spec as canonical JSON (its digest is the
    request body's identity for idempotent retries, and it is what the row stores)."""

    spec: JobSpecData
    request_id: str
    body: str = ""
    user: str = ""  # the user whose token submitted it (not part of the body: a retry may come from another)
    digest: str = ""
    job_id: str = ""

    def __post_init__(self) -> None:
        if not self.body:
            self.body = self.spec.canonical_json()
            self.digest = hashlib.sha256(self.body.encode()).hexdigest()
        if not self.job_id:
            self.job_id = new_job_id()


@dataclass(frozen=True)
class Stored:
    """Where a submission ended: a new job (created, with its creation time) or the job
    an earlier submission with the same request id made (not created)."""

    job_id: str
    created: bool
    created_at: datetime | None = None


# One statement stores a whole batch (driver parameter style, so the api's batch writer
# and a Session run the same text). Rows of unknown tenants drop out in the join, rows
# whose (tenant, request id) exists already drop out in ON CONFLICT: ON CONFLICT waits for
# a concurrent uncommitted insert of the same key and then skips it, the retry semantics
# the old advisory lock gave, in one round trip. Rows go in key order, so two batches
# sharing keys wait on each other in one order only (no deadlock), and of two equal
# request ids in one batch the one that arrived first is stored. The text is the same
# for every batch size, so the server plans it once per connection. The arrays go in
# binary (%b): in text form every character of every JSON body is escaped for the array
# literal, which cost more CPU than the rest of the statement.
INSERT_BATCH_SQL = """
INSERT INTO jobs (id, tenant, name, kind, priority, gpus, spec, spec_hash, request_id, state,
                  reason, gpu_indices, progress, error, epoch, attempts, submitted_by)
SELECT v.id, v.tenant, v.name, v.kind, v.priority, v.gpus, v.spec::jsonb, v.spec_hash, v.request_id,
       %(state)s, 'submitted', '{}', '{}', '', 0, 0, v.submitted_by
FROM unnest(%(ids)b::text[], %(tenants)b::text[], %(names)b::text[], %(kinds)b::text[],
            %(priorities)b::int[], %(gpus)b::int[], %(specs)b::text[], %(hashes)b::text[],
            %(request_ids)b::text[], %(users)b::text[]) WITH ORDINALITY
     AS v(id, tenant, name, kind, priority, gpus, spec, spec_hash, request_id, submitted_by, n)
JOIN tenants t ON t.name = v.tenant
ORDER BY v.tenant, v.request_id, v.n
ON CONFLICT (tenant, request_id) DO NOTHING
RETURNING id, created_at
"""


# The earlier jobs of the submissions that were not inserted (a retry, or a request id
# reused): committed ones, and this transaction's own when it inserts them too.
FIND_REQUESTS_SQL = """
SELECT j.tenant, j.request_id, j.id, j.spec_hash FROM jobs j
JOIN unnest(%(tenants)s::text[], %(request_ids)s::text[]) AS k(tenant, request_id)
  ON j.tenant = k.tenant AND j.request_id = k.request_id
"""


def insert_params(batch: Sequence[Submission]) -> dict[str, Any]:
    return {
        "state": jobstate.PENDING,
        "ids": [s.job_id for s in batch],
        "tenants": [s.spec.tenant for s in batch],
        "names": [s.spec.name for s in batch],
        "kinds": [s.spec.kind for s in batch],
        "priorities": [s.spec.priority for s in batch],
        "gpus": [s.spec.gpus for s in batch],
        "specs": [s.body for s in batch],
        "hashes": [s.digest for s in batch],
        "request_ids": [s.request_id or None for s in batch],
        "users": [s.user or None for s in batch],
    }


def find_params(batch: Sequence[Submission], inserted: dict[str, datetime]) -> dict[str, Any] | None:
    """Parameters of FIND_REQUESTS_SQL for what was not inserted; None when nothing is to find."""
    keys = sorted({(s.spec.tenant, s.request_id) for s in batch if s.job_id not in inserted and s.request_id})
    if not keys:
        return None
    return {"tenants": [t for t, _ in keys], "request_ids": [r for _, r in keys]}


def outcomes(
    batch: Sequence[Submission], inserted: dict[str, datetime], earlier: Sequence[Sequence[Any]]
) -> list[Stored | DomainError]:
    """Per submission: Stored, or the error that submission alone gets. Same request id +
    same body -> the first job; another body -> ALREADY_EXISTS; two equal request ids in
    one batch behave as if submitted one after the other."""
    first = {(str(tenant), str(request_id)): (str(job_id), str(digest)) for tenant, request_id, job_id, digest in earlier}
    results: list[Stored | DomainError] = []
    for s in batch:
        at = inserted.get(s.job_id)
        if at is not None:
            results.append(Stored(s.job_id, True, at))
            continue
        found = first.get((s.spec.tenant, s.request_id)) if s.request_id else None
        if found is None:
            results.append(InvalidArgument("tenant", f"unknown tenant {s.spec.tenant!r}"))
        elif found[1] != s.digest:
            results.append(AlreadyExists(f"request_id {s.request_id!r} was used for a different job ({found[0]})"))
        else:
            results.append(Stored(found[0], False))
    return results


def submit_jobs(session: Session, batch: Sequence[Submission]) -> list[Stored | DomainError]:
    """Stores validated specs as PENDING in the session's transaction (see `outcomes`)."""
    if not batch:
        return []
    conn = session.connection()
    inserted = {str(job_id): at for job_id, at in conn.exec_driver_sql(INSERT_BATCH_SQL, insert_params(batch))}
    find = find_params(batch, inserted)
    earlier = conn.exec_driver_sql(FIND_REQUESTS_SQL, find).all() if find is not None else []
    return outcomes(batch, inserted, earlier)


def submit_job(
    session: Session, spec: JobSpecData, request_id: str, events: Events
) -> tuple[JobRow, bool]:
    """Stores a validated spec as PENDING. Same request id + same body -> the first job."""
    [result] = submit_jobs(session, [Submission(spec, request_id)])
    if isinstance(result, DomainError):
        raise result
    job = session.get(JobRow, result.job_id)
    assert job is not None  # inserted or found in this very transaction
    if result.created:
        events.add(job, "state")
    return job, result.created


async def store_batch(conn: psycopg.AsyncConnection[tuple[Any, ...]],
                      batch: Sequence[Submission]) -> list[Stored | DomainError]:
    """The group commit: stores `batch` on an autocommit connection (the INSERT is its own
    transaction, committed before it answers; see `outcomes`)."""
    cur = await conn.execute(INSERT_BATCH_SQL, insert_params(batch))
    inserted: dict[str, datetime] = {str(job_id): at for job_id, at in await cur.fetchall()}
    find = find_params(batch, inserted)
    earlier: list[tuple[Any, ...]] = []
    if find is not None:
        # Rows that ON CONFLICT skipped were committed before it returned: a new statement sees them.
        earlier = await (await conn.execute(FIND_REQUESTS_SQL, find)).fetchall()
    return outcomes(batch, inserted, earlier)
