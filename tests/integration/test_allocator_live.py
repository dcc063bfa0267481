"""The allocator's live planning on a real PostgreSQL: the view it plans from, resizes of
realtime apps under new epochs, the plan records `rota plan` reads and their retention.

Each test gets its own database, since the view reads every job in it.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from datetime import timedelta
from typing import Any

import pytest
from allocator_fixtures import setup_cluster, submit
from ledger_fixtures import ADMIN, LedgerServer
from sqlalchemy import func, select, update

from rota.allocator import repository as alloc
from rota.allocator.loop import PRUNE_INTERVAL_S, SchedulingLoop
from rota.allocator.models import PlanStepRow
from rota.allocator.peers import Peers
from rota.api import repository as api
from rota.cluster import job_lifecycle, job_starts, planner_view
from rota.cluster.job_lifecycle import Events
from rota.cluster.models import GpuClaimRow, PlacementRow
from rota.common.agents import AgentClients
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis
from rota.core.planning.liveplan import Start


@pytest.fixture
def db(private_db: Database) -> Database:
    return private_db


def test_the_view_lists_holding_jobs_then_the_queue_with_durations_and_demand(db: Database) -> None:
    tenant, node = setup_cluster(db)
    first = submit(db, tenant, gpus=2, duration_seconds=600.0)
    app = submit(db, tenant, kind="realtime", gpus=0, demand=[1, 2], max_swap=1)
    db.run(lambda s: job_starts.commit_decision(s, Start(first, node, (0, 1)), Events()))
    view = db.run(planner_view.live_view)
    assert [n.name for n in view.nodes] == [node] and view.nodes[0].gpus == 4
    assert [j.id for j in view.jobs] == [first, app]
    held, queued = view.jobs
    assert (held.node, held.gpu_indices, held.duration_s) == (node, (0, 1), 600.0)
    assert (queued.node, queued.demand, queued.max_swap, queued.gpus) == (None, (1, 2), 1, 2)


def test_a_resize_swaps_claims_and_leases_under_a_newer_epoch(db: Database) -> None:
    tenant, node = setup_cluster(db)
    app = submit(db, tenant, kind="realtime", gpus=1)
    placed = db.run(lambda s: job_starts.commit_decision(s, Start(app, node, (3,)), Events()))
    assert placed is not None
    resized = db.run(lambda s: job_starts.commit_resize(s, Start(app, node, (2, 3)), Events()))
    assert resized is not None and resized.epoch > placed.epoch
    claims = db.run(lambda s: [(c.gpu_index, c.epoch) for c in s.scalars(select(GpuClaimRow).order_by(GpuClaimRow.gpu_index))])
    assert claims == [(2, resized.epoch), (3, resized.epoch)]
    leases = db.run(lambda s: [(p.gpu_indices, p.released_at is None, p.release_reason)
                               for p in s.scalars(select(PlacementRow).order_by(PlacementRow.id))])
    assert leases == [([3], False, "resized to 2 replicas"), ([2, 3], True, "")]
    # A resize for a node the app is not on changes nothing.
    assert db.run(lambda s: job_starts.commit_resize(s, Start(app, "elsewhere", (0,)), Events())) is None


def test_a_cycle_starts_step_zero_explains_the_rest_and_records_the_plan(db: Database, redis_url: str) -> None:
    tenant, node = setup_cluster(db, gpus=2)
    first = submit(db, tenant, gpus=2, duration_seconds=120.0)
    second = submit(db, tenant, gpus=2, duration_seconds=60.0)
    settings = Settings(plan_step_s=60.0, plan_horizon=6, full_interval_s=0, api_addr="127.0.0.1:1")
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings), clock=lambda: 6000.0)
    report = asyncio.run(loop.cycle())
    loop.leadership.release()
    assert (report.placed, report.waiting, report.planned) == (1, 1, "first plan of this leader")
    jobs = {j.id: j for j in db.run(planner_view.live_view).jobs}
    assert jobs[first].node == node
    reason = db.run(lambda s: job_lifecycle.get_job(s, second).reason)  # type: ignore[union-attr]
    assert "planned at step 2" in reason and first in reason, reason
    step = db.run(alloc.latest_plan_step)
    assert step is not None and step.policy == "fast" and step.horizon == 6
    assert step.assignments[first]["start_step"] == 0 and step.assignments[second]["start_step"] == 2
    assert step.grid["labels"] == [f"{node}/0", f"{node}/1"]
    assert step.grid["rows"][0] == [[first, 2], [second, 1], ["", 3]]


def test_under_fair_an_over_share_tenant_yields_an_expired_lease_to_an_under_served_one(
    db: Database, redis_url: str
) -> None:
    greedy, node = setup_cluster(db, gpus=2)
    modest = "t-" + secrets.token_hex(3)
    db.run(lambda s: api.create_tenant(s, modest, 1.0, secrets.token_hex(32)))
    hog = submit(db, greedy, gpus=2, preemptible=True, restart="on-failure")
    db.run(lambda s: job_starts.commit_decision(s, Start(hog, node, (0, 1)), Events()))
    waiting = submit(db, modest, gpus=1, duration_seconds=60.0)
    ledger = LedgerServer(db)  # the standings come from the real LedgerService, over gRPC
    settings = Settings(policy="fair", plan_step_s=60.0, plan_horizon=6, full_interval_s=0, api_addr="127.0.0.1:1",
                        fair_lease_s=0.001, fair_delay_s=0.0, admin_token=ADMIN, service_addrs={"ledger": ledger.target})
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings))


    async def two_cycles() -> tuple[Any, Any]:
        await loop.cycle()
        after_first = db.run(lambda s: job_lifecycle.get_job(s, hog))
        await loop.cycle()  # the freed GPUs go to the under-served tenant first
        return after_first, db.run(lambda s: job_lifecycle.get_job(s, waiting))

    try:
        yielded, started = asyncio.run(two_cycles())
    finally:
        loop.leadership.release()
        ledger.stop()
    assert yielded is not None and yielded.state == "PENDING" and yielded.node is None
    assert f"yielded its GPUs to {waiting}" in yielded.reason
    assert started is not None and started.state == "SCHEDULED"


def test_an_agent_that_never_answers_does_not_hold_the_cycle(db: Database, redis_url: str) -> None:
    # A listening socket nobody accepts from: the kernel completes the connection, nothing
    # answers, as with an agent frozen by SIGSTOP. Its launch call would wait out a 10 s deadline.
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)
    tenant, node = setup_cluster(db, gpus=1, address=f"127.0.0.1:{frozen.getsockname()[1]}")
    job = submit(db, tenant)
    settings = Settings(plan_step_s=60.0, plan_horizon=4, full_interval_s=0, api_addr="127.0.0.1:1")
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings))
    try:
        report = asyncio.run(asyncio.wait_for(loop.cycle(), timeout=5.0))
    finally:
        loop.leadership.release()
        frozen.close()
    assert report.placed == 1
    assert db.run(lambda s: job_lifecycle.get_job(s, job).state) == "SCHEDULED"  # type: ignore[union-attr]


def record_steps(db: Database, count: int, age_s: float) -> list[int]:
    """`count` plan steps created `age_s` seconds ago; their ids, oldest first."""
    def write(s: Any) -> list[int]:
        rows = [alloc.record_plan_step(s, policy="fast", trigger="test", step_seconds=60.0, horizon=6, step_index=0,
                                       figures={}, assignments={}, grid={}) for _ in range(count)]
        ids = [r.id for r in rows]
        s.execute(update(PlanStepRow).where(PlanStepRow.id.in_(ids))
                  .values(created_at=func.now() - timedelta(seconds=age_s)))
        return ids
    return db.run(write)


def step_ids(db: Database) -> list[int]:
    return db.run(lambda s: list(s.scalars(select(PlanStepRow.id).order_by(PlanStepRow.id))))


def test_pruning_deletes_steps_past_retention_oldest_first_in_batches(db: Database) -> None:
    old = record_steps(db, 5, age_s=8 * 86400)
    recent = record_steps(db, 2, age_s=3600)
    assert db.run(lambda s: alloc.prune_plan_steps(s, 7 * 86400, batch=3)) == 3
    assert step_ids(db) == old[3:] + recent
    assert db.run(lambda s: alloc.prune_plan_steps(s, 7 * 86400, batch=3)) == 2
    assert step_ids(db) == recent


def test_pruning_keeps_the_newest_step_however_old_it_is(db: Database) -> None:
    old = record_steps(db, 3, age_s=30 * 86400)
    assert db.run(lambda s: alloc.prune_plan_steps(s, 86400, batch=100)) == 2
    assert step_ids(db) == old[-1:]


def test_the_leader_prunes_plan_steps_once_per_interval(db: Database, redis_url: str) -> None:
    now = [6000.0]
    settings = Settings(plan_retention_s=86400, api_addr="127.0.0.1:1")
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings), clock=lambda: now[0])
    async def cycles() -> list[int]:
        pruned = []
        record_steps(db, 4, age_s=2 * 86400)
        record_steps(db, 1, age_s=0)
        pruned.append((await loop.cycle()).pruned)
        record_steps(db, 2, age_s=2 * 86400)
        record_steps(db, 1, age_s=0)
        now[0] += PRUNE_INTERVAL_S / 2
        pruned.append((await loop.cycle()).pruned)  # not yet: once per interval
        now[0] += PRUNE_INTERVAL_S / 2
        pruned.append((await loop.cycle()).pruned)
        return pruned

    try:
        assert asyncio.run(cycles()) == [4, 0, 2]
    finally:
        loop.leadership.release()
