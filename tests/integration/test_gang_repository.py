"""A gang in Postgres: one epoch and claims on every node, reports from every node, one
job that succeeds when all its nodes do and stops whole when one fails or dies."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from test_jobs_repository import (  # the same builders as the single-node tests
    _silence,
    claims,
    load,
    placements,
    register,
    report,
    submit,
    transitions,
)

from rota.api import repository as api
from rota.cluster import heartbeats, job_starts, node_lifecycle, planner_view
from rota.cluster.job_lifecycle import Events
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


def place_gang(db: Database, job_id: str, nodes: list[str]) -> Any:
    job = db.run(lambda s: job_starts.commit_decision(s, Start(job_id, nodes[0], (0, 1), nodes=tuple(nodes)), Events()))
    assert job is not None
    return job


def test_a_gang_claims_every_node_under_one_epoch_and_its_rendezvous(db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2), register(db, gpus=2)]
    job_id = submit(db, tenant, gpus=0, nodes=2, gpus_per_node=2)
    job = place_gang(db, job_id, nodes)
    assert (job.node, job.gang_nodes, job.gpu_indices) == (nodes[0], nodes, [0, 1])
    assert {(n, g) for n, g, _j, e in claims(db, job_id=job_id) if e == job.epoch} == {(n, g) for n in nodes for g in (0, 1)}
    host, port = job.gang_master.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == job_starts.GANG_PORT_BASE + job.epoch % job_starts.GANG_PORT_SPAN
    [p] = placements(db, job_id)
    assert p.gang_nodes == nodes and p.epoch == job.epoch
    # Both agents are told to run it (their heartbeat answers list it).
    assert [j.id for j in report(db, nodes[1], job, js.RUNNING)] == [job_id]
    assert load(db, job_id).state == js.RUNNING
    assert [j.id for j in report(db, nodes[0], job, js.RUNNING)] == [job_id]


def test_a_gang_succeeds_only_when_every_node_has_exited_zero_and_counts_a_repeat_once(db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2), register(db, gpus=2)]
    job_id = submit(db, tenant, gpus=0, nodes=2, gpus_per_node=2)
    job = place_gang(db, job_id, nodes)
    report(db, nodes[0], job, js.SUCCEEDED)
    report(db, nodes[0], job, js.SUCCEEDED)  # repeated until the agent hears the answer
    assert load(db, job_id).state == js.RUNNING and claims(db, job_id=job_id)
    report(db, nodes[1], job, js.SUCCEEDED)
    done = load(db, job_id)
    assert (done.state, done.exit_code, claims(db, job_id=job_id)) == (js.SUCCEEDED, 0, [])
    assert transitions(db, job_id)[-1][2] == "exit code 0 on all 2 nodes"


def _queued_and_blocked(db: Database, job_id: str, node: str) -> tuple[bool, tuple[int, ...]]:
    """Whether the plan sees the job, and the GPUs of `node` it must leave alone."""
    view = db.run(lambda s: planner_view.live_view(s))
    [live] = [n for n in view.nodes if n.name == node]
    return any(j.id == job_id for j in view.jobs), live.bad_gpus


def test_one_failed_rank_group_stops_the_whole_gang_and_it_is_requeued_once_its_other_ranks_stop(
        db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2), register(db, gpus=2)]
    job_id = submit(db, tenant, gpus=0, nodes=2, gpus_per_node=2, restart="on-failure")
    job = place_gang(db, job_id, nodes)
    report(db, nodes[0], job, js.RUNNING)
    assigned = report(db, nodes[1], job, js.FAILED, exit_code=3, error="gloo: connection reset")
    again = load(db, job_id)
    assert (again.state, again.gang_nodes, again.gang_master, again.node) == (js.PENDING, [], "", None)
    assert assigned == []
    why = transitions(db, job_id)[-1][2]
    assert f"rank group on {nodes[1]} failed (exit code 3); the whole gang stopped" in why and nodes[0] in why
    # The failed node's GPUs are free; the other node's stay claimed while its ranks may run,
    # and the plan neither places the gang again nor anything else on those GPUs.
    assert {(n, g) for n, g, _j, _e in claims(db, job_id=job_id)} == {(nodes[0], 0), (nodes[0], 1)}
    assert _queued_and_blocked(db, job_id, nodes[0]) == (False, (0, 1))
    assert report(db, nodes[0], job, js.RUNNING) == []  # its agent is told to stop its group ...
    assert claims(db, job_id=job_id)  # ... which still runs
    quiet = Events()
    db.run(lambda s: heartbeats.heartbeat(s, nodes[1], [], quiet))
    assert not quiet.gpus_freed  # nothing of the gang on the failed node any more
    report(db, nodes[0], job, js.FAILED, exit_code=143)  # ... and has ended
    assert claims(db, job_id=job_id) == []
    assert _queued_and_blocked(db, job_id, nodes[0]) == (True, ())
    assert load(db, job_id).state == js.PENDING  # the late exit changes nothing else


def test_a_stopped_gangs_node_that_reports_no_group_or_dies_frees_its_claims(db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2) for _ in range(4)]
    job_id = submit(db, tenant, gpus=0, nodes=4, gpus_per_node=2, restart="on-failure")
    job = place_gang(db, job_id, nodes)
    report(db, nodes[3], job, js.SUCCEEDED)  # its group is over: its GPUs go with the failure
    report(db, nodes[2], job, js.FAILED, exit_code=1)
    assert {n for n, _g, _j, _e in claims(db, job_id=job_id)} == {nodes[0], nodes[1]}
    events = Events()
    db.run(lambda s: heartbeats.heartbeat(s, nodes[0], [], events))  # it runs no such group (any more)
    assert events.gpus_freed  # the allocator is woken: the gang may be placeable
    assert {n for n, _g, _j, _e in claims(db, job_id=job_id)} == {nodes[1]}
    _silence(db, nodes[1], 600)
    declared = db.run(lambda s: node_lifecycle.declare_dead_nodes(s, 60, Events()))
    [dead] = [d for d in declared if d.name == nodes[1]]
    assert (nodes[1], job_id, job.epoch) in [(c.node, c.job_id, c.epoch) for c in dead.copies]  # the allocator stops it
    assert claims(db, job_id=job_id) == []


def test_a_dead_node_of_a_gang_loses_the_whole_gang(db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2), register(db, gpus=2)]
    job_id = submit(db, tenant, gpus=0, nodes=2, gpus_per_node=2, restart="on-failure")
    job = place_gang(db, job_id, nodes)
    report(db, nodes[0], job, js.RUNNING)
    _silence(db, nodes[1], 600)  # node rank 1, not the job's `node`
    events = Events()
    declared = db.run(lambda s: node_lifecycle.declare_dead_nodes(s, 60, events))
    assert nodes[1] in [d.name for d in declared]
    lost = load(db, job_id)
    # Its ranks on the live node run on until they are stopped: that copy is to stop too,
    # and its GPUs there stay claimed (the gang unplaceable) until that node says it ended.
    assert lost.state == js.PENDING and {n for n, _g, _j, _e in claims(db, job_id=job_id)} == {nodes[0]}
    assert _queued_and_blocked(db, job_id, nodes[0])[0] is False
    [dead] = [d for d in declared if d.name == nodes[1]]
    assert sorted((c.node, c.job_id, c.epoch) for c in dead.copies) == sorted((n, job_id, job.epoch) for n in nodes)
    report(db, nodes[0], job, js.FAILED, exit_code=143)
    assert claims(db, job_id=job_id) == [] and _queued_and_blocked(db, job_id, nodes[0])[0] is True
    reasons = [r for _f, t, r in transitions(db, job_id) if t == js.LOST]
    assert reasons and f"node {nodes[1]} (node of its 2-node gang) missed heartbeats" in reasons[0]


def test_the_ledger_charges_a_gang_on_every_node(db: Database, tenant: str) -> None:
    nodes = [register(db, gpus=2), register(db, gpus=2)]
    job_id = submit(db, tenant, gpus=0, nodes=2, gpus_per_node=2)
    job = place_gang(db, job_id, nodes)
    report(db, nodes[0], job, js.RUNNING)
    report(db, nodes[0], job, js.SUCCEEDED)
    report(db, nodes[1], job, js.SUCCEEDED)
    collect_all(db)
    rows = db.run(lambda s: [(r.lease_id, r.node, list(r.gpu_indices)) for r in
                             s.scalars(select(UsageRow).where(UsageRow.job_id == job_id))])
    [p] = placements(db, job_id)
    assert sorted(rows) == sorted([(f"p{p.id}", nodes[0], [0, 1]), (f"p{p.id}n1", nodes[1], [0, 1])])
