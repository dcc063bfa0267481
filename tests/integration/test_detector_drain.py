"""Draining on a real PostgreSQL: DRAINING survives heartbeats and re-registration, the
allocator plans nothing new there while running jobs go on, and ALIVE/DEAD keep their meaning."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from rota.api import repository as api
from rota.cluster import heartbeats, job_starts, node_lifecycle, planner_view, submissions
from rota.cluster.job_lifecycle import Events, get_job, utcnow
from rota.cluster.models import GpuRow, NodeRow
from rota.common.db import Database
from rota.core import jobstate, nodestate
from rota.core.errors import FailedPrecondition
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning.liveplan import Horizon, Start
from rota.core.planning.planner import plan_live


def register(db: Database, name: str, gpus: int = 2) -> None:
    rows = [GpuRow(node=name, index=i, uuid=f"{name}-{i}", model="virtual", virtual=True) for i in range(gpus)]
    db.run(lambda s: node_lifecycle.register(s, name, "127.0.0.1:1", rows))


def submit(db: Database, gpus: int = 2, **spec: object) -> str:
    data = JobSpecData(name="j", tenant="t", kind="training", priority=5, gpus=gpus, command=["true"], duration_seconds=600)
    for k, v in spec.items():
        setattr(data, k, v)
    job, _ = db.run(lambda s: submissions.submit_job(s, validate(data, max_gpus_per_node=0), "", Events()))
    return job.id


def health(db: Database, name: str) -> str:
    node = db.run(lambda s: s.get(NodeRow, name))
    assert node is not None
    return node.health


@pytest.fixture
def cluster(private_db: Database) -> Database:
    private_db.run(lambda s: api.create_tenant(s, "t", 1.0, "hash-t"))
    register(private_db, "node-a")
    register(private_db, "node-b")
    return private_db


def test_a_drained_node_keeps_its_running_job_and_gets_no_new_one(cluster: Database) -> None:
    db = cluster
    running = submit(db, restart="on-failure", max_retries=1)
    assert db.run(lambda s: job_starts.commit_decision(s, Start(running, "node-a", (0, 1)), Events())) is not None
    assert db.run(lambda s: node_lifecycle.drain(s, "node-a", undo=False)) == (nodestate.DRAINING, 1)

    new = submit(db)
    view = db.run(planner_view.live_view)
    assert [n.name for n in view.nodes] == ["node-b"]
    assert any(j.id == running and j.node == "node-a" for j in view.jobs)  # still holding, still running
    outcome = plan_live(view.nodes, view.jobs, Horizon(60.0, 8, time.time()), "fast")
    assert [(s.job_id, s.node) for s in outcome.decision.starts] == [(new, "node-b")]
    job = db.run(lambda s: get_job(s, running))
    assert job is not None and job.state == jobstate.SCHEDULED and job.node == "node-a"


def test_draining_survives_heartbeats_and_a_restarted_agent_until_undone(cluster: Database) -> None:
    db = cluster
    db.run(lambda s: node_lifecycle.drain(s, "node-a", undo=False))
    db.run(lambda s: heartbeats.heartbeat(s, "node-a", [], Events()))
    assert health(db, "node-a") == nodestate.DRAINING
    register(db, "node-a")
    assert health(db, "node-a") == nodestate.DRAINING
    assert db.run(lambda s: node_lifecycle.drain(s, "node-a", undo=True)) == (nodestate.ALIVE, 0)
    assert [n.name for n in db.run(planner_view.live_view).nodes] == ["node-a", "node-b"]


def test_a_silent_draining_node_dies_like_any_other_and_comes_back_alive(cluster: Database) -> None:
    db = cluster
    job_id = submit(db, restart="on-failure", max_retries=1)
    db.run(lambda s: job_starts.commit_decision(s, Start(job_id, "node-a", (0, 1)), Events()))
    db.run(lambda s: node_lifecycle.drain(s, "node-a", undo=False))
    db.run(node_lifecycle.grant_restart_grace)  # an api restart gives a draining node its grace too
    assert db.run(lambda s: node_lifecycle.declare_dead(s, 3.0, Events())) == []
    old = utcnow() - timedelta(seconds=60)
    db.run(lambda s: s.execute(update(NodeRow).where(NodeRow.name == "node-a").values(last_heartbeat=old)))
    assert db.run(lambda s: node_lifecycle.declare_dead(s, 3.0, Events())) == ["node-a"]
    assert health(db, "node-a") == nodestate.DEAD
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == jobstate.PENDING  # lost, requeued by its restart policy
    with pytest.raises(FailedPrecondition):
        db.run(lambda s: node_lifecycle.drain(s, "node-a", undo=False))
    db.run(lambda s: heartbeats.heartbeat(s, "node-a", [], Events()))
    assert health(db, "node-a") == nodestate.ALIVE


def test_one_clock_decides_a_death_the_databases(cluster: Database) -> None:
    # The beat is stamped with the database's now(), and the deadline is measured on it too:
    # silence is the database's, whatever the clock of the process that asks.
    stamped, now = cluster.run(lambda s: (node_lifecycle.beat(s, "node-a").last_heartbeat, s.scalar(select(func.now()))))
    assert stamped == now
    cluster.run(lambda s: s.execute(update(NodeRow).where(NodeRow.name == "node-a")
                                    .values(last_heartbeat=func.now() - timedelta(seconds=30))))
    assert cluster.run(lambda s: node_lifecycle.declare_dead(s, 31.0, Events())) == []
    assert cluster.run(lambda s: node_lifecycle.declare_dead(s, 29.0, Events())) == ["node-a"]
    assert health(cluster, "node-a") == nodestate.DEAD
    cluster.run(lambda s: node_lifecycle.beat(s, "node-a"))
    assert health(cluster, "node-a") == nodestate.ALIVE
