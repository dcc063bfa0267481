"""Job persistence on a real PostgreSQL: tenants, idempotent submissions, claims and
fencing epochs, heartbeat reports, dead nodes and cancellation.

Tests share the session's migrated database; each uses its own tenant and node names.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from rota.allocator import repository as alloc
from rota.api import repository as api
from rota.checkpoint import repository as ckpt
from rota.cluster import (
    heartbeats,
    job_lifecycle,
    job_starts,
    node_lifecycle,
    planner_view,
    queries,
    submissions,
)
from rota.cluster.job_lifecycle import Events, get_job, history, utcnow
from rota.cluster.models import GpuClaimRow, GpuRow, JobRow, NodeRow, PlacementRow
from rota.common import read_models
from rota.common.db import Database, make_engine
from rota.core import jobstate as js
from rota.core import nodestate
from rota.core.errors import AlreadyExists, InvalidArgument, NotFound
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning.liveplan import Start


@pytest.fixture(scope="module")
def db(migrated_database_url: str) -> Iterator[Database]:
    engine = make_engine(migrated_database_url)
    yield Database(engine)
    engine.dispose()


@pytest.fixture
def tenant(db: Database) -> str:
    name = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, name, 1.0, secrets.token_hex(32)))
    return name


@pytest.fixture
def node(db: Database) -> str:
    """A registered node with four GPUs."""
    return register(db, gpus=4)


def register(db: Database, gpus: int) -> str:
    name = "n-" + secrets.token_hex(4)
    rows = [GpuRow(node=name, index=i, uuid=f"{name}-gpu{i}", model="virtual", virtual=True) for i in range(gpus)]
    db.run(lambda s: node_lifecycle.register(s, name, f"127.0.0.1:{50000 + gpus}", rows))
    return name


def make_spec(tenant: str, **overrides: Any) -> JobSpecData:
    spec = JobSpecData(name="job", tenant=tenant, kind="training", priority=5, gpus=1, command=["true"])
    for key, value in overrides.items():
        setattr(spec, key, value)
    return validate(spec, max_gpus_per_node=0)


def submit(db: Database, tenant: str, request_id: str = "", **overrides: Any) -> str:
    spec = make_spec(tenant, **overrides)
    job, created = db.run(lambda s: submissions.submit_job(s, spec, request_id, Events()))
    assert created
    return job.id


def place(db: Database, job_id: str, node: str, gpus: tuple[int, ...]) -> JobRow:
    job = db.run(lambda s: job_starts.commit_decision(s, Start(job_id, node, gpus), Events()))
    assert job is not None
    return job


def report(db: Database, node: str, job: JobRow | str, state: str, *, epoch: int | None = None,
           exit_code: int = 0, error: str = "", progress: dict[str, object] | None = None) -> list[JobRow]:
    job_row = load(db, job) if isinstance(job, str) else job
    rep = heartbeats.JobReport(job_row.id, job_row.epoch if epoch is None else epoch, state, exit_code, error, progress)
    _node, assigned = db.run(lambda s: heartbeats.heartbeat(s, node, [rep], Events()))
    return list(assigned)


def load(db: Database, job_id: str) -> JobRow:
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None
    return job


def claims(db: Database, *, node: str | None = None, job_id: str | None = None) -> list[tuple[str, int, str, int]]:
    def read(s: Any) -> list[tuple[str, int, str, int]]:
        stmt = select(GpuClaimRow).order_by(GpuClaimRow.node, GpuClaimRow.gpu_index)
        if node is not None:
            stmt = stmt.where(GpuClaimRow.node == node)
        if job_id is not None:
            stmt = stmt.where(GpuClaimRow.job_id == job_id)
        return [(c.node, c.gpu_index, c.job_id, c.epoch) for c in s.scalars(stmt)]
    return db.run(read)


def placements(db: Database, job_id: str) -> list[PlacementRow]:
    return list(db.run(lambda s: s.scalars(
        select(PlacementRow).where(PlacementRow.job_id == job_id).order_by(PlacementRow.id)).all()))


def transitions(db: Database, job_id: str) -> list[tuple[str, str, str]]:
    return [(t.from_state, t.to_state, t.reason) for t in db.run(lambda s: history(s, job_id))]


def states(db: Database, job_id: str) -> list[str]:
    rows = transitions(db, job_id)
    return [rows[0][0], *(to for _f, to, _r in rows)] if rows else []


# Tenants.
def test_tenant_create_list_and_duplicate(db: Database) -> None:
    name, token_hash = "t-" + secrets.token_hex(4), secrets.token_hex(32)
    row = db.run(lambda s: api.create_tenant(s, name, 2.5, token_hash))
    assert (row.name, row.share) == (name, 2.5)
    with pytest.raises(AlreadyExists, match=name):
        db.run(lambda s: api.create_tenant(s, name, 1.0, secrets.token_hex(32)))
    assert name in [t.name for t in db.run(api.list_tenants)]
    found = db.run(lambda s: api.tenant_by_token_hash(s, token_hash))
    assert found is not None and found.name == name and found.share == 2.5
    assert db.run(lambda s: api.tenant_by_token_hash(s, "0" * 64)) is None


# Submissions.
def test_submit_stores_a_pending_job_with_history(db: Database, tenant: str) -> None:
    events = Events()
    spec = make_spec(tenant, gpus=2, restart="on-failure")
    job, created = db.run(lambda s: submissions.submit_job(s, spec, "", events))
    assert created and job.id.startswith("j-")
    stored = load(db, job.id)
    assert (stored.state, stored.tenant, stored.gpus, stored.attempts, stored.epoch) == (js.PENDING, tenant, 2, 0, 0)
    assert stored.spec["max_retries"] == 3 and stored.spec_hash == spec.digest()
    assert [e[:2] for e in events.items] == [(job.id, "state")]
    assert events.items[0][2]["state"] == js.PENDING


def test_submit_is_idempotent_by_request_id(db: Database, tenant: str) -> None:
    spec = make_spec(tenant, gpus=2)
    first, created = db.run(lambda s: submissions.submit_job(s, spec, "req-1", Events()))
    assert created
    again, created_again = db.run(lambda s: submissions.submit_job(s, make_spec(tenant, gpus=2), "req-1", Events()))
    assert (again.id, created_again) == (first.id, False)
    with pytest.raises(AlreadyExists, match="req-1"):
        db.run(lambda s: submissions.submit_job(s, make_spec(tenant, gpus=4), "req-1", Events()))
    count = db.run(lambda s: s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant == tenant)))
    assert count == 1
    # Without a request id every call is a new job.
    a, b = submit(db, tenant), submit(db, tenant)
    assert a != b


def test_same_request_id_in_another_tenant_is_another_job(db: Database, tenant: str) -> None:
    other = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, other, 1.0, secrets.token_hex(32)))
    assert submit(db, tenant, "shared-id") != submit(db, other, "shared-id")


def test_unknown_tenant_is_invalid_and_stores_nothing(db: Database) -> None:
    ghost = "ghost-" + secrets.token_hex(4)
    with pytest.raises(InvalidArgument) as info:
        db.run(lambda s: submissions.submit_job(s, make_spec(ghost), "r", Events()))
    assert info.value.field == "tenant"
    count = db.run(lambda s: s.scalar(select(func.count()).select_from(JobRow).where(JobRow.tenant == ghost)))
    assert count == 0


def test_list_jobs_filters_by_tenant_and_state(db: Database, tenant: str, node: str) -> None:
    a, b = submit(db, tenant), submit(db, tenant)
    place(db, a, node, (0,))
    listed = db.run(lambda s: queries.list_jobs(s, tenant, [], 10))
    assert {j.id for j in listed} == {a, b}
    pending = db.run(lambda s: queries.list_jobs(s, tenant, [js.PENDING], 10))
    assert [j.id for j in pending] == [b]


def test_largest_node_counts_gpus(db: Database) -> None:
    register(db, gpus=2)
    assert db.run(queries.largest_node_gpus) >= 2


# Placement commits.
def test_commit_decision_claims_gpus_with_increasing_epochs(db: Database, tenant: str, node: str) -> None:
    a, b = submit(db, tenant, gpus=2), submit(db, tenant, gpus=1)
    events = Events()
    job_a = db.run(lambda s: job_starts.commit_decision(s, Start(a, node, (0, 1)), events))
    job_b = place(db, b, node, (2,))
    assert job_a is not None
    assert job_b.epoch > job_a.epoch > 0
    assert (job_a.state, job_a.node, list(job_a.gpu_indices), job_a.attempts) == (js.SCHEDULED, node, [0, 1], 1)
    assert claims(db, node=node) == [
        (node, 0, a, job_a.epoch), (node, 1, a, job_a.epoch), (node, 2, b, job_b.epoch)
    ]
    [p] = placements(db, a)
    assert (p.node, list(p.gpu_indices), p.epoch, p.released_at) == (node, [0, 1], job_a.epoch, None)
    assert transitions(db, a)[-1][:2] == (js.PENDING, js.SCHEDULED)
    assert f"epoch {job_a.epoch}" in transitions(db, a)[-1][2]
    assert [(e[0], e[2]["state"]) for e in events.items] == [(a, js.SCHEDULED)]
    # A job that is no longer pending is not placed again.
    assert db.run(lambda s: job_starts.commit_decision(s, Start(a, node, (3,)), Events())) is None
    assert claims(db, job_id=a) == [(node, 0, a, job_a.epoch), (node, 1, a, job_a.epoch)]


def test_double_booking_is_refused_by_the_database(db: Database, tenant: str, node: str) -> None:
    a, b = submit(db, tenant, gpus=2), submit(db, tenant, gpus=2)
    job_a = place(db, a, node, (0, 1))
    # An allocator with a stale view tries to put b on GPU 1, already claimed by a.
    with pytest.raises(IntegrityError, match="gpu_claims"):
        db.run(lambda s: job_starts.commit_decision(s, Start(b, node, (1, 2)), Events()))
    # Nothing of the refused commit was written: b is untouched, a keeps its claims.
    job_b = load(db, b)
    assert (job_b.state, job_b.node, job_b.epoch, job_b.attempts, list(job_b.gpu_indices)) == (js.PENDING, None, 0, 0, [])
    assert placements(db, b) == [] and claims(db, job_id=b) == [] and transitions(db, b) == []
    assert claims(db, node=node) == [(node, 0, a, job_a.epoch), (node, 1, a, job_a.epoch)]
    # The same job on free GPUs still goes through afterwards.
    assert place(db, b, node, (2, 3)).epoch > job_a.epoch


def test_the_live_view_sees_nodes_holding_jobs_then_the_queue_in_order(db: Database, tenant: str, node: str) -> None:
    a, b, c = submit(db, tenant, gpus=2), submit(db, tenant, gpus=1), submit(db, tenant, gpus=4)
    place(db, a, node, (2, 3))
    view = db.run(planner_view.live_view)
    [mine] = [n for n in view.nodes if n.name == node]
    assert mine.gpus == 4
    mine_jobs = [(j.id, j.gpus, j.node, j.gpu_indices) for j in view.jobs if j.id in (a, b, c)]
    assert mine_jobs == [(a, 2, node, (2, 3)), (b, 1, None, ()), (c, 4, None, ())]
    assert view.addresses[node].startswith("127.0.0.1:")
    db.run(lambda s: job_starts.set_waiting_reasons(s, {c: "waiting: test reason"}))
    assert load(db, c).reason == "waiting: test reason"


# Heartbeat reports.
def test_reports_run_a_job_to_success_and_release_its_claims(db: Database, tenant: str, node: str) -> None:
    job_id = submit(db, tenant, gpus=2)
    job = place(db, job_id, node, (0, 1))
    assigned = report(db, node, job, js.RUNNING, progress={"step": 10, "loss": 3.5})
    assert job_id in [j.id for j in assigned]
    running = load(db, job_id)
    assert running.state == js.RUNNING and running.started_at is not None
    assert running.progress == {"step": 10, "loss": 3.5}
    assert len(claims(db, job_id=job_id)) == 2

    assigned = report(db, node, job, js.SUCCEEDED, progress={"step": 300, "loss": 2.31})
    assert job_id not in [j.id for j in assigned]
    done = load(db, job_id)
    assert (done.state, done.exit_code, done.progress) == (js.SUCCEEDED, 0, {"step": 300, "loss": 2.31})
    assert done.finished_at is not None
    assert claims(db, job_id=job_id) == []
    [p] = placements(db, job_id)
    assert p.released_at is not None and p.release_reason == "succeeded"
    assert states(db, job_id) == [js.PENDING, js.SCHEDULED, js.RUNNING, js.SUCCEEDED]
    assert all(reason for _f, _t, reason in transitions(db, job_id))


def test_a_finished_report_from_scheduled_passes_through_running(db: Database, tenant: str, node: str) -> None:
    job_id = submit(db, tenant)
    report(db, node, place(db, job_id, node, (0,)), js.SUCCEEDED)
    assert states(db, job_id) == [js.PENDING, js.SCHEDULED, js.RUNNING, js.SUCCEEDED]


def test_failure_with_restart_on_failure_requeues_until_retries_run_out(
    db: Database, tenant: str, node: str
) -> None:
    job_id = submit(db, tenant, restart="on-failure", max_retries=1)
    first = place(db, job_id, node, (0,))
    report(db, node, first, js.RUNNING)
    report(db, node, first, js.FAILED, exit_code=3, error="Traceback: boom")
    requeued = load(db, job_id)
    assert (requeued.state, requeued.attempts, requeued.node, list(requeued.gpu_indices)) == (js.PENDING, 1, None, [])
    assert (requeued.exit_code, requeued.error) == (3, "Traceback: boom")
    assert "retry 1/1" in requeued.reason and "exit code 3" in requeued.reason
    assert claims(db, job_id=job_id) == []

    second = place(db, job_id, node, (1,))
    assert second.attempts == 2 and second.epoch > first.epoch
    assert (second.exit_code, second.error) == (None, "")
    report(db, node, second, js.FAILED, exit_code=1, error="again")
    failed = load(db, job_id)
    assert (failed.state, failed.attempts, failed.exit_code, failed.error) == (js.FAILED, 2, 1, "again")
    assert failed.finished_at is not None and claims(db, job_id=job_id) == []
    assert states(db, job_id) == [
        js.PENDING, js.SCHEDULED, js.RUNNING, js.PENDING, js.SCHEDULED, js.RUNNING, js.FAILED
    ]


def test_failure_with_restart_never_fails(db: Database, tenant: str, node: str) -> None:
    job_id = submit(db, tenant, restart="never")
    report(db, node, place(db, job_id, node, (0,)), js.FAILED, exit_code=2, error="bad shard 3")
    job = load(db, job_id)
    assert (job.state, job.error, job.attempts) == (js.FAILED, "bad shard 3", 1)
    assert claims(db, job_id=job_id) == []


def test_reports_with_a_stale_epoch_or_from_another_node_are_ignored(db: Database, tenant: str, node: str) -> None:
    other = register(db, gpus=4)
    job_id = submit(db, tenant, restart="on-failure")
    first = place(db, job_id, node, (0,))
    report(db, node, first, js.FAILED, exit_code=1)  # requeued
    second = place(db, job_id, other, (0,))
    before = states(db, job_id)
    # The old copy on the first node reports again under its old epoch: ignored.
    assigned = report(db, node, job_id, js.SUCCEEDED, epoch=first.epoch)
    assert job_id not in [j.id for j in assigned]
    # A report under the right epoch but from the wrong node: ignored too.
    report(db, node, job_id, js.FAILED, epoch=second.epoch, exit_code=9)
    # An unknown job: ignored.
    db.run(lambda s: heartbeats.heartbeat(s, node, [heartbeats.JobReport("j-nope", 1, js.RUNNING, 0, "", None)], Events()))
    job = load(db, job_id)
    assert (job.state, job.node, job.epoch) == (js.SCHEDULED, other, second.epoch)
    assert states(db, job_id) == before
    assert claims(db, job_id=job_id) == [(other, 0, job_id, second.epoch)]
    # The new placement's own report does count.
    assigned = report(db, other, job_id, js.RUNNING)
    assert [j.id for j in assigned if j.id == job_id] == [job_id]
    assert load(db, job_id).state == js.RUNNING


def test_heartbeat_from_an_unregistered_node_is_not_found(db: Database) -> None:
    with pytest.raises(NotFound):
        db.run(lambda s: heartbeats.heartbeat(s, "n-unknown-" + secrets.token_hex(3), [], Events()))


# Dead nodes.
def _silence(db: Database, node: str, seconds: float) -> None:
    db.run(lambda s: s.execute(
        update(NodeRow).where(NodeRow.name == node).values(last_heartbeat=utcnow() - timedelta(seconds=seconds))
    ))


def test_silent_node_goes_dead_and_its_jobs_are_lost_then_handled(db: Database, tenant: str, node: str) -> None:
    retrying = submit(db, tenant, restart="on-failure")
    final = submit(db, tenant, restart="never")
    report(db, node, place(db, retrying, node, (0,)), js.RUNNING)
    report(db, node, place(db, final, node, (1,)), js.RUNNING)
    healthy = register(db, gpus=1)
    _silence(db, node, 600)

    epochs = {job_id: load(db, job_id).epoch for job_id in (retrying, final)}
    events = Events()
    declared = db.run(lambda s: node_lifecycle.declare_dead_nodes(s, 60, events))
    dead = [d.name for d in declared]
    assert node in dead and healthy not in dead
    # The copies the node may still run, under the epochs they were placed with, to stop there.
    [copies] = [d.copies for d in declared if d.name == node]
    assert sorted((c.job_id, c.epoch) for c in copies) == sorted(epochs.items())
    assert {c.node for c in copies} == {node} and all(c.address for c in copies)
    health = db.run(lambda s: s.scalars(select(NodeRow.health).where(NodeRow.name.in_([node, healthy]))).all())
    assert sorted(health) == [nodestate.ALIVE, nodestate.DEAD]

    requeued, failed = load(db, retrying), load(db, final)
    assert (requeued.state, requeued.node, requeued.attempts) == (js.PENDING, None, 1)
    assert failed.state == js.FAILED
    assert claims(db, node=node) == []
    assert all(p.release_reason == "node lost" for j in (retrying, final) for p in placements(db, j))
    for job_id, end in ((retrying, js.PENDING), (final, js.FAILED)):
        rows = transitions(db, job_id)
        assert [(f, t) for f, t, _ in rows[-2:]] == [(js.RUNNING, js.LOST), (js.LOST, end)]
        assert all(f"node {node} missed heartbeats" in reason for _f, _t, reason in rows[-2:])
    assert "retry 1/3" in transitions(db, retrying)[-1][2]
    assert {(e[0], e[2]["state"]) for e in events.items} >= {
        (retrying, js.LOST), (retrying, js.PENDING), (final, js.LOST), (final, js.FAILED)
    }
    # Already dead: not reported twice; a new heartbeat brings the node back.
    assert node not in db.run(lambda s: node_lifecycle.declare_dead(s, 60, Events()))
    node_row, _ = db.run(lambda s: heartbeats.heartbeat(s, node, [], Events()))
    assert node_row.health == nodestate.ALIVE


def _complete_image(db: Database, job_id: str, node: str, step: int) -> str:
    manifest = {"ranks": [{"rank": 0, "logical_bytes": 10, "segments": [{"length": 10, "chunks": [[secrets.token_hex(32), 10]]}]}]}

    def write(s: Any) -> str:
        image = ckpt.begin_image(s, job_id, "checkpoint", node)
        ckpt.complete_image(s, image.id, manifest, step=step, copy_s=0.5, write_s=1.5)
        return image.id

    return db.run(write)


def test_a_dead_nodes_job_with_an_image_is_restored_elsewhere_whatever_its_restart_policy(
    db: Database, tenant: str, node: str
) -> None:
    imaged = submit(db, tenant, restart="never")
    bare = submit(db, tenant, restart="never")
    report(db, node, place(db, imaged, node, (0,)), js.RUNNING)
    report(db, node, place(db, bare, node, (1,)), js.RUNNING)
    image = _complete_image(db, imaged, node, step=40)
    _silence(db, node, 600)
    assert node in db.run(lambda s: node_lifecycle.declare_dead(s, 60, Events()))
    restored, failed = load(db, imaged), load(db, bare)
    assert (restored.state, restored.node, restored.gpu_indices) == (js.PENDING, None, [])
    assert f"restored from its last image {image}" in transitions(db, imaged)[-1][2]
    assert failed.state == js.FAILED  # no image, restart: never
    # Its next placement restores from that image.
    assert db.run(lambda s: read_models.resume_image(s, imaged)) == image


def test_move_inputs_price_jobs_with_images_and_read_the_node_a_pending_job_asked_for(
    db: Database, tenant: str, node: str
) -> None:
    imaged = submit(db, tenant, preemptible=True)
    bare = submit(db, tenant, preemptible=True)
    report(db, node, place(db, imaged, node, (0,)), js.RUNNING)
    _complete_image(db, imaged, node, step=3)
    asked = submit(db, tenant)
    db.run(lambda s: ckpt.create_operation(s, asked, "resume", "", target_node=node))
    found = db.run(lambda s: alloc.move_inputs(s, [imaged, bare]))
    assert set(found.costs) == {imaged}  # no image: its cost is unknown, it is never moved
    assert found.costs[imaged].restore_s == 1.5 and found.costs[imaged].pause_s == pytest.approx(0.5 + alloc.PAUSE_EXIT_S)
    assert found.targets == {asked: node}


# Cancellation.
def test_cancel_releases_claims(db: Database, tenant: str, node: str) -> None:
    job_id = submit(db, tenant, gpus=2)
    place(db, job_id, node, (2, 3))
    report(db, node, job_id, js.RUNNING)
    events = Events()
    job, stop_on = db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "", events))
    assert (job.state, stop_on) == (js.CANCELLED, [node])
    assert claims(db, job_id=job_id) == []
    [p] = placements(db, job_id)
    assert (p.release_reason, p.released_at is not None) == ("cancelled", True)
    assert transitions(db, job_id)[-1] == (js.RUNNING, js.CANCELLED, "cancelled by user")
    assert [e[2]["state"] for e in events.items] == [js.CANCELLED]
    # Cancelling again changes nothing.
    again, stop_again = db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "twice", Events()))
    assert (again.state, stop_again) == (js.CANCELLED, [])
    assert len(transitions(db, job_id)) == 3


def test_a_cancelled_jobs_exit_code_is_the_stopped_process_one(db: Database, tenant: str, node: str) -> None:
    job_id = submit(db, tenant)
    place(db, job_id, node, (0,))
    report(db, node, job_id, js.RUNNING)
    db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "", Events()))
    assert load(db, job_id).exit_code is None  # the process is stopped after the commit
    report(db, node, job_id, js.FAILED, exit_code=143, error="stopped: cancelled")
    job = load(db, job_id)
    assert (job.state, job.exit_code) == (js.CANCELLED, 143)
    # Another placement's report, or a later one, does not overwrite it.
    report(db, node, job_id, js.FAILED, epoch=job.epoch + 1, exit_code=137)
    report(db, node, job_id, js.FAILED, exit_code=1)
    assert load(db, job_id).exit_code == 143


def test_cancel_pending_job_needs_no_agent(db: Database, tenant: str) -> None:
    job_id = submit(db, tenant)
    job, stop_on = db.run(lambda s: job_lifecycle.cancel_job(s, job_id, "no longer needed", Events()))
    assert (job.state, stop_on, job.reason) == (js.CANCELLED, [], "no longer needed")
    with pytest.raises(NotFound):
        db.run(lambda s: job_lifecycle.cancel_job(s, "j-missing", "", Events()))

