"""Job arrays and dependencies in the api's Postgres: one statement stores a whole array,
parents are checked against the submitter's tenant, an array is cancelled task by task.

An array of N tasks is one INSERT of the array's row and N job rows (the spec bound once,
the indices as one array parameter), in the caller's transaction: 10,000 tasks are one
round trip and one commit, not 10,000. Tasks carry no request id of their own: the
array's row holds it, and a retry that finds it inserts nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from rota.cluster import job_lifecycle, submissions
from rota.cluster.job_lifecycle import Events, get_job, new_job_id
from rota.cluster.models import JobArrayRow, JobRow
from rota.core import dependencies, jobstate
from rota.core.arrays import ArraySpec, task_id
from rota.core.errors import AlreadyExists, InvalidArgument
from rota.core.jobspec import JobSpecData

# The array's row first (nothing when its (tenant, request id) exists, or the tenant does
# not), then every task from it: a task exists only with its array, in one statement.
INSERT_ARRAY_SQL = text("""
WITH arr AS (
    INSERT INTO job_arrays (id, tenant, name, count, max_running, request_id, spec_hash)
    SELECT :id, t.name, :name, :count, :max_running, :request_id, :digest FROM tenants t WHERE t.name = :tenant
    ON CONFLICT (tenant, request_id) DO NOTHING
    RETURNING id, created_at
), tasks AS (
    INSERT INTO jobs (id, tenant, name, kind, priority, gpus, spec, spec_hash, request_id, state, reason,
                      gpu_indices, progress, error, epoch, attempts, array_id, array_index, created_at, submitted_by)
    SELECT arr.id || '_' || v.i, :tenant, :name, :kind, :priority, :gpus, CAST(:spec AS jsonb), :spec_hash, NULL,
           :pending, 'submitted', '{}', '{}', '', 0, 0, arr.id, v.i, arr.created_at, :user
    FROM arr, unnest(CAST(:indices AS int[])) AS v(i)
    RETURNING 1
)
SELECT arr.id, arr.created_at, (SELECT count(*) FROM tasks) FROM arr
""")


@dataclass
class ArraySubmission:
    """A validated array submission; `digest` is the body's identity for retries (the spec,
    the indices and the cap)."""

    spec: JobSpecData
    array: ArraySpec
    request_id: str
    array_id: str = field(default_factory=new_job_id)
    body: str = ""
    spec_hash: str = ""
    digest: str = ""
    user: str = ""  # the user whose token submitted it

    def __post_init__(self) -> None:
        self.body = self.spec.canonical_json()
        self.spec_hash = hashlib.sha256(self.body.encode()).hexdigest()
        shape = ",".join(map(str, self.array.indices)) + f"%{self.array.max_running}"
        self.digest = hashlib.sha256(f"{self.spec_hash}/{shape}".encode()).hexdigest()


@dataclass(frozen=True)
class StoredArray:
    array_id: str
    created: bool
    job_ids: list[str]
    count: int
    max_running: int
    created_at: datetime | None = None


def submit_array(session: Session, item: ArraySubmission) -> StoredArray:
    """Stores every task PENDING in the session's transaction; a retry (same request id,
    same body) returns the first array, another body ALREADY_EXISTS."""
    check_parents(session, item.spec)
    spec = item.spec
    row = session.execute(INSERT_ARRAY_SQL, {
        "id": item.array_id, "tenant": spec.tenant, "name": spec.name, "count": len(item.array.indices),
        "max_running": item.array.max_running, "request_id": item.request_id or None, "digest": item.digest,
        "kind": spec.kind, "priority": spec.priority, "gpus": spec.gpus, "spec": item.body,
        "spec_hash": item.spec_hash, "pending": jobstate.PENDING, "indices": list(item.array.indices),
        "user": item.user or None,
    }).first()
    if row is not None:
        ids = [task_id(item.array_id, i) for i in item.array.indices]
        return StoredArray(item.array_id, True, ids, len(ids), item.array.max_running, row[1])
    earlier = session.scalars(select(JobArrayRow).where(
        JobArrayRow.tenant == spec.tenant, JobArrayRow.request_id == (item.request_id or None))).first()
    if earlier is None or not item.request_id:
        raise InvalidArgument("tenant", f"unknown tenant {spec.tenant!r}")
    if earlier.spec_hash != item.digest:
        raise AlreadyExists(f"request_id {item.request_id!r} was used for a different array ({earlier.id})")
    return StoredArray(earlier.id, False, task_ids(session, earlier.id), earlier.count, earlier.max_running,
                       earlier.created_at)


def submit_dependent(session: Session, item: submissions.Submission, events: Events) -> submissions.Stored:
    """A job with `depends_on`: its parents checked and the job stored in one transaction
    (the batcher's statement cannot read parents)."""
    check_parents(session, item.spec)
    [stored] = submissions.submit_jobs(session, [item])
    if isinstance(stored, Exception):
        raise stored
    if stored.created:
        job = get_job(session, stored.job_id)
        if job is not None:
            events.add(job, "state")
    return stored


def check_parents(session: Session, spec: JobSpecData) -> None:
    """Every parent is a job or an array of the submitting tenant (another tenant's reads as
    unknown, so ids cannot be probed); no cycle closes through the new job."""
    if not spec.depends_on:
        return
    wanted = [d["job"] for d in spec.depends_on]
    jobs = dict(session.execute(select(JobRow.id, JobRow.tenant).where(JobRow.id.in_(wanted))).all())
    arrays = dict(session.execute(
        select(JobArrayRow.id, JobArrayRow.tenant).where(JobArrayRow.id.in_(wanted))).all())
    for i, parent in enumerate(wanted):
        if jobs.get(parent, arrays.get(parent)) != spec.tenant:
            raise InvalidArgument(f"depends_on[{i}].job", f"no job or array {parent} of tenant {spec.tenant}")
    # The parents' own parents: a cycle would have to pass through one of them. A new job
    # has no id anyone could name yet, so this finds none today; it guards a batch API.
    edges: dict[str, list[str]] = {"<new>": wanted}
    for job_id, raw in session.execute(select(JobRow.id, JobRow.spec).where(JobRow.id.in_(wanted))):
        edges[job_id] = [d["job"] for d in (raw or {}).get("depends_on", [])]
    cycle = dependencies.find_cycle(edges)
    if cycle is not None:
        raise InvalidArgument("depends_on", "a cycle: " + " -> ".join(cycle))


def task_ids(session: Session, array_id: str) -> list[str]:
    stmt = select(JobRow.id).where(JobRow.array_id == array_id).order_by(JobRow.array_index)
    return list(session.scalars(stmt).all())


def get_array(session: Session, array_id: str) -> JobArrayRow | None:
    return session.get(JobArrayRow, array_id)


def state_counts(session: Session, array_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Each array's tasks by state (one grouped read, on the (array_id, state) index)."""
    if not array_ids:
        return {}
    counts: dict[str, dict[str, int]] = {a: {} for a in array_ids}
    stmt = (select(JobRow.array_id, JobRow.state, func.count()).where(JobRow.array_id.in_(list(array_ids)))
            .group_by(JobRow.array_id, JobRow.state))
    for array_id, state, n in session.execute(stmt):
        counts[str(array_id)][state] = int(n)
    return counts


def arrays_of(session: Session, array_ids: Sequence[str]) -> list[JobArrayRow]:
    if not array_ids:
        return []
    return list(session.scalars(select(JobArrayRow).where(JobArrayRow.id.in_(list(array_ids)))
                                .order_by(JobArrayRow.created_at.desc())).all())


def cancel_array(session: Session, array_id: str, reason: str, events: Events) -> list[tuple[JobRow, list[str]]]:
    """Every unfinished task cancelled through the one cancel path; each with the nodes whose
    agents must stop it."""
    # One locked read of every unfinished task (not a query per task: arrays are large).
    tasks = session.scalars(select(JobRow).where(
        JobRow.array_id == array_id, JobRow.state.notin_(jobstate.FINAL_STATES))
        .order_by(JobRow.array_index).with_for_update()).all()
    why = reason or f"array {array_id} cancelled"
    return [(job, job_lifecycle.cancel_row(session, job, why, events)) for job in tasks]


def summary(row: JobArrayRow, counts: dict[str, int], job_ids: Sequence[str] = ()) -> dict[str, Any]:
    """The array as plain data, for the handler to turn into its message."""
    return {"id": row.id, "tenant": row.tenant, "name": row.name, "count": row.count,
            "max_running": row.max_running, "states": counts, "job_ids": list(job_ids), "created_at": row.created_at}
