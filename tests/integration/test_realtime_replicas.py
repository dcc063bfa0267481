"""A realtime app across nodes in Postgres: a lease per node under its own epoch, each
agent told its own node's replicas, one node resized or lost without touching the others,
and the ledger billing each node's replicas for the time they were held."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from test_jobs_repository import _silence, claims, load, placements, register, submit, transitions

from rota.api import repository as api
from rota.cluster import heartbeats, job_protos, job_starts, node_lifecycle
from rota.cluster.job_lifecycle import Events, nodes_of
from rota.common.db import Database, make_engine
from rota.core import jobstate as js
from rota.core.planning.liveplan import Start
from rota.ledger.collector import collect_all
from rota.ledger.models import UsageRow


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


def place_app(db: Database, tenant: str, sets: dict[str, tuple[int, ...]], **spec: Any) -> str:
    app = submit(db, tenant, kind="realtime", gpus=0, demand=[sum(len(g) for g in sets.values())], **spec)
    home = next(iter(sets))
    job = db.run(lambda s: job_starts.commit_decision(s, Start(app, home, sets[home], replicas=tuple(sets.items())), Events()))
    assert job is not None
    return app


def epochs(db: Database, app: str) -> dict[str, int]:
    return {n: int(v["epoch"]) for n, v in load(db, app).replicas.items()}


def beat(db: Database, node: str, app: str, state: str, *, epoch: int | None = None, exit_code: int = 0,
         progress: dict[str, object] | None = None) -> list[Any]:
    """The node's heartbeat with one report of the app (under its node's epoch); the assignments as protos."""
    rep = heartbeats.JobReport(app, epochs(db, app).get(node, -1) if epoch is None else epoch, state, exit_code, "", progress)
    return db.run(lambda s: [job_protos.job_on_node(j, node) for j in heartbeats.heartbeat(s, node, [rep], Events())[1]])


def test_a_start_on_two_nodes_is_a_lease_per_node_and_each_agent_sees_its_own_gpus(db: Database, tenant: str) -> None:
    a, b = register(db, gpus=2), register(db, gpus=2)
    app = place_app(db, tenant, {a: (0, 1), b: (1,)})
    job = load(db, app)
    assert (job.node, job.gpu_indices, job.gang_nodes) == (a, [0, 1], [])  # home: the CLI's node and GPUs
    e = epochs(db, app)
    assert e[a] != e[b] and job.epoch == max(e.values()) and nodes_of(job) == [a, b]
    assert claims(db, job_id=app) == sorted([(a, 0, app, e[a]), (a, 1, app, e[a]), (b, 1, app, e[b])])
    assert sorted((p.node, p.gpu_indices, p.epoch) for p in placements(db, app)) == sorted([(a, [0, 1], e[a]), (b, [1], e[b])])
    # Each agent's assignment: only its node's GPUs, under its node's epoch.
    [on_a] = beat(db, a, app, js.RUNNING)
    [on_b] = beat(db, b, app, js.RUNNING)
    assert (on_a.node, list(on_a.gpus), on_a.epoch) == (a, [0, 1], e[a])
    assert (on_b.node, list(on_b.gpus), on_b.epoch) == (b, [1], e[b])
    assert [r.node for r in on_b.replicas] == [b]
    assert load(db, app).state == js.RUNNING
    # The api's copy lists every node, home first.
    full = job_protos.job_to_proto(load(db, app))
    assert [(r.node, list(r.gpus)) for r in full.replicas] == [(a, [0, 1]), (b, [1])]


def test_no_gpu_is_claimed_twice_across_apps(db: Database, tenant: str) -> None:
    a = register(db, gpus=2)
    place_app(db, tenant, {a: (0,)})
    with pytest.raises(IntegrityError):
        place_app(db, tenant, {a: (0, 1)})


def test_a_resize_of_one_node_leaves_the_other_nodes_lease_alone(db: Database, tenant: str) -> None:
    a, b, c = register(db, gpus=2), register(db, gpus=2), register(db, gpus=2)
    app = place_app(db, tenant, {a: (0, 1)})
    first = epochs(db, app)
    grown = db.run(lambda s: job_starts.commit_resize(s, Start(app, b, (0, 1)), Events()))
    assert grown is not None and grown.previous_epoch == 0 and grown.epoch > first[a]  # b: a launch there
    shrunk = db.run(lambda s: job_starts.commit_resize(s, Start(app, a, (1,)), Events()))
    assert shrunk is not None and shrunk.previous_epoch == first[a]
    now = epochs(db, app)
    assert now == {a: shrunk.epoch, b: grown.epoch}
    assert claims(db, job_id=app) == sorted([(a, 1, app, now[a]), (b, 0, app, now[b]), (b, 1, app, now[b])])
    # The app leaves a: its home moves to b; a resize may never leave it without a replica.
    left = db.run(lambda s: job_starts.commit_resize(s, Start(app, a, ()), Events()))
    assert left is not None and left.gpus == () and left.previous_epoch == now[a]
    job = load(db, app)
    assert (job.node, job.gpu_indices, set(job.replicas)) == (b, [0, 1], {b})
    assert db.run(lambda s: job_starts.commit_resize(s, Start(app, b, ()), Events())) is None
    assert db.run(lambda s: job_starts.commit_resize(s, Start(app, "no-such-node", (0,)), Events())) is None
    # A report under b's old epoch... there is none: b was never resized. An old epoch of a is ignored.
    assert beat(db, a, app, js.FAILED, epoch=first[a], exit_code=1) == []
    assert load(db, app).state == js.SCHEDULED
    leases = sorted((p.node, p.gpu_indices, p.released_at is not None) for p in placements(db, app))
    assert leases == sorted([(a, [0, 1], True), (a, [1], True), (b, [0, 1], False)])
    del c


def test_progress_sums_the_nodes_and_a_node_whose_replicas_exit_ends_only_there(db: Database, tenant: str) -> None:
    a, b = register(db, gpus=2), register(db, gpus=2)
    app = place_app(db, tenant, {a: (0, 1), b: (0,)}, restart="never")
    beat(db, a, app, js.RUNNING, progress={"served": 100, "replicas": 2, "epoch": 1})
    beat(db, b, app, js.RUNNING, progress={"served": 30, "replicas": 1, "epoch": 2})
    progress = load(db, app).progress
    assert (progress["served"], progress["replicas"]) == (130, 3)
    beat(db, b, app, js.FAILED, exit_code=3)  # b's replicas failed: b's lease ends, a serves on
    job = load(db, app)
    assert job.state == js.RUNNING and set(job.replicas) == {a} and claims(db, node=b) == []
    assert f"its replicas on {b} exited with 3" in job.reason
    beat(db, a, app, js.RUNNING, progress={"served": 150, "replicas": 2})
    assert load(db, app).progress["served"] == 180  # b's 30 stay counted: `served` never falls
    beat(db, a, app, js.FAILED, exit_code=1)  # its last node: the app fails as a one-node job would
    job = load(db, app)
    assert job.state == js.FAILED and claims(db, job_id=app) == [] and job.replicas == {}


def test_a_dead_node_loses_only_its_replicas_and_the_last_node_loses_the_app(db: Database, tenant: str) -> None:
    a, b = register(db, gpus=2), register(db, gpus=2)
    app = place_app(db, tenant, {a: (0, 1), b: (0, 1)}, restart="on-failure")
    beat(db, a, app, js.RUNNING)
    _silence(db, a, 600)  # the home node dies
    assert a in db.run(lambda s: node_lifecycle.declare_dead(s, 60, Events()))
    job = load(db, app)
    assert job.state == js.RUNNING and (job.node, set(job.replicas)) == (b, {b})
    assert claims(db, node=a) == [] and [n for n, *_ in claims(db, job_id=app)] == [b, b]
    assert f"node {a} missed heartbeats" in job.reason and "serving on" in job.reason
    assert not [t for _f, t, _r in transitions(db, app) if t == js.LOST]
    # The next plan re-grows it elsewhere (here by hand), then its last original node dies.
    c = register(db, gpus=2)
    assert db.run(lambda s: job_starts.commit_resize(s, Start(app, c, (0,)), Events())) is not None
    _silence(db, b, 600)
    _silence(db, c, 600)
    db.run(lambda s: node_lifecycle.declare_dead(s, 60, Events()))
    job = load(db, app)
    assert job.state == js.PENDING and claims(db, job_id=app) == [] and job.replicas == {} and job.node is None
    assert [t for _f, t, _r in transitions(db, app)].count(js.LOST) == 1


def test_the_ledger_bills_each_nodes_replicas_for_the_time_they_were_held(db: Database, tenant: str) -> None:
    a, b = register(db, gpus=2), register(db, gpus=2)
    app = place_app(db, tenant, {a: (0, 1), b: (1,)})
    db.run(lambda s: job_starts.commit_resize(s, Start(app, b, ()), Events()))  # b's lease closes, a's runs on
    collect_all(db)
    rows = db.run(lambda s: [(r.lease_id, r.node, list(r.gpu_indices)) for r in
                             s.scalars(select(UsageRow).where(UsageRow.job_id == app))])
    by_node = {p.node: p for p in placements(db, app)}
    assert sorted(rows) == sorted([(f"p{by_node[a].id}", a, [0, 1]), (f"p{by_node[b].id}", b, [1])])
    assert by_node[b].released_at is not None and by_node[a].released_at is None
