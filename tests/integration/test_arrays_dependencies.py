"""Job arrays and dependencies on a real PostgreSQL: an array of 10,000 tasks is one
statement in one transaction; retries are idempotent; parents must exist and be the
tenant's; the allocator's snapshot gates %K and dependencies, and fails a dependent whose
parent failed, once."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from submission_builders import job_spec, new_tenant

from rota.cluster import job_arrays, job_starts, planner_view, submissions
from rota.cluster.job_lifecycle import Events, get_job
from rota.cluster.models import JobRow
from rota.common.db import Database
from rota.core import jobstate as js
from rota.core.arrays import parse_array
from rota.core.errors import AlreadyExists, InvalidArgument
from rota.core.jobspec import JobSpecData


def tenant(db: Database) -> str:
    return new_tenant(db)


def spec(tenant: str, **overrides: Any) -> JobSpecData:
    return job_spec(tenant, "task", **overrides)


def submit(db: Database, s: JobSpecData, indices: str, request_id: str = "") -> job_arrays.StoredArray:
    item = job_arrays.ArraySubmission(s, parse_array(indices), request_id)
    return db.run(lambda session: job_arrays.submit_array(session, item))


def job(db: Database, s: JobSpecData) -> str:
    stored = db.run(lambda session: job_arrays.submit_dependent(session, submissions.Submission(s, ""), Events()))
    return stored.job_id


def set_state(db: Database, job_id: str, state: str) -> None:
    db.run(lambda s: s.execute(update(JobRow).where(JobRow.id == job_id).values(state=state)))


def test_an_array_of_10000_tasks_is_one_statement_in_one_transaction(private_db: Database) -> None:
    t = tenant(private_db)
    started = time.perf_counter()
    stored = submit(private_db, spec(t), "0-9999%4", "r-1")
    took = time.perf_counter() - started
    print(f"\n10,000 array tasks stored in {took:.3f} s")  # printed, never asserted
    assert stored.created and stored.count == 10_000 and stored.max_running == 4
    assert stored.job_ids[:2] == [f"{stored.array_id}_0", f"{stored.array_id}_1"]

    def facts(session: Any) -> tuple[int, int, int, int]:
        row = session.execute(text(
            "SELECT count(*), count(DISTINCT xmin::text), count(DISTINCT created_at), count(DISTINCT array_index) "
            "FROM jobs WHERE array_id = :a"), {"a": stored.array_id}).one()
        return tuple(int(v) for v in row)

    # One transaction (one xmin) wrote every row, at one creation time; each its own index.
    assert private_db.run(facts) == (10_000, 1, 1, 10_000)
    task = private_db.run(lambda s: get_job(s, f"{stored.array_id}_9999"))
    assert task is not None and (task.state, task.array_index, task.tenant) == (js.PENDING, 9999, t)


def test_a_retry_returns_the_first_array_and_another_body_is_refused(private_db: Database) -> None:
    t = tenant(private_db)
    first = submit(private_db, spec(t), "0-4", "same")
    again = submit(private_db, spec(t), "0-4", "same")
    assert (again.array_id, again.created, again.job_ids) == (first.array_id, False, first.job_ids)
    with pytest.raises(AlreadyExists):
        submit(private_db, spec(t), "0-5", "same")
    assert private_db.run(lambda s: s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant == t))) == 5
    with pytest.raises(InvalidArgument) as err:
        submit(private_db, spec("ghost-" + secrets.token_hex(3)), "0-1")
    assert err.value.field == "tenant"


def test_parents_must_exist_and_be_the_tenants(private_db: Database) -> None:
    mine, theirs = tenant(private_db), tenant(private_db)
    parent = job(private_db, spec(mine))
    other = job(private_db, spec(theirs))
    assert job(private_db, spec(mine, depends_on=[{"job": parent, "when": "succeeded"}]))
    for bad in ("j-0000000000", other):
        with pytest.raises(InvalidArgument) as err:
            job(private_db, spec(mine, depends_on=[{"job": parent, "when": "succeeded"}, {"job": bad, "when": "finished"}]))
        assert err.value.field == "depends_on[1].job"
        with pytest.raises(InvalidArgument):
            submit(private_db, spec(mine, depends_on=[{"job": bad, "when": "succeeded"}]), "0-1")
    whole = submit(private_db, spec(mine), "0-1")  # an array is a parent too
    assert job(private_db, spec(mine, depends_on=[{"job": whole.array_id, "when": "succeeded"}]))


def test_the_snapshot_holds_back_beyond_k_and_waiting_dependents(private_db: Database) -> None:
    t = tenant(private_db)
    capped = submit(private_db, spec(t), "0-5%2")
    set_state(private_db, capped.job_ids[0], js.RUNNING)
    parent = job(private_db, spec(t))
    child = job(private_db, spec(t, depends_on=[{"job": parent, "when": "succeeded"}]))
    gate = private_db.run(planner_view.live_view).gate()
    # One running, one slot left: task 1 is planned, 2..5 wait; the child waits for its parent.
    assert sorted(gate.held_back) == sorted([*capped.job_ids[2:], child])
    assert gate.held_back[capped.job_ids[3]] == f"waiting: array {capped.array_id} runs 2 of at most 2 at once"
    assert gate.held_back[child] == f"waiting: waits for {parent} to succeed"
    set_state(private_db, parent, js.SUCCEEDED)
    assert child not in private_db.run(planner_view.live_view).gate().held_back


def test_a_dependent_of_a_failed_parent_fails_once_with_the_reason(private_db: Database) -> None:
    t = tenant(private_db)
    parent = job(private_db, spec(t))
    child = job(private_db, spec(t, depends_on=[{"job": parent, "when": "succeeded"}]))
    grandchild = job(private_db, spec(t, depends_on=[{"job": child, "when": "succeeded"}]))
    set_state(private_db, parent, js.FAILED)
    gate = private_db.run(planner_view.live_view).gate()
    assert set(gate.doomed) == {child, grandchild}
    failed = private_db.run(lambda s: job_starts.fail_unsatisfiable(s, gate.doomed, Events()))
    assert sorted(failed) == sorted([child, grandchild])
    assert private_db.run(lambda s: job_starts.fail_unsatisfiable(s, gate.doomed, Events())) == []  # idempotent
    row = private_db.run(lambda s: get_job(s, child))
    assert row is not None and row.state == js.FAILED
    assert row.reason == f"dependency {parent} failed; it can no longer succeed"


def test_cancelling_an_array_cancels_every_unfinished_task(private_db: Database) -> None:
    t = tenant(private_db)
    stored = submit(private_db, spec(t), "0-3")
    set_state(private_db, stored.job_ids[0], js.SUCCEEDED)
    done = private_db.run(lambda s: [(j.id, j.state) for j, _ in job_arrays.cancel_array(s, stored.array_id, "", Events())])
    assert done == [(i, js.CANCELLED) for i in stored.job_ids[1:]]
    counts = private_db.run(lambda s: job_arrays.state_counts(s, [stored.array_id]))
    assert counts == {stored.array_id: {js.SUCCEEDED: 1, js.CANCELLED: 3}}
