"""What keeps the allocator's cycle cheap with thousands queued, on a real PostgreSQL:
specs parsed once per digest, waiting reasons and forecasts written in one statement and
only where they changed, and a rest after a costly plan that moves nothing.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
from allocator_fixtures import setup_cluster, submit
from sqlalchemy import text

from rota.allocator import repository as alloc
from rota.allocator.loop import SchedulingLoop
from rota.allocator.peers import Peers
from rota.cluster import job_lifecycle, job_starts, planner_view
from rota.cluster.job_lifecycle import Events
from rota.common.agents import AgentClients
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis
from rota.core.planning.liveplan import Start


@pytest.fixture
def db(private_db: Database) -> Database:
    return private_db


def xmin(db: Database, job_id: str) -> int:
    """The transaction that last wrote the row: unchanged means not rewritten."""
    return int(db.run(lambda s: s.execute(text("SELECT xmin::text::bigint FROM jobs WHERE id = :id"), {"id": job_id}).scalar_one()))


def test_a_cached_view_parses_each_spec_once_and_sees_what_a_fresh_view_sees(db: Database) -> None:
    tenant, node = setup_cluster(db)
    same = [submit(db, tenant, gpus=1, duration_seconds=60.0) for _ in range(3)]
    other = submit(db, tenant, gpus=2, duration_seconds=600.0, priority=9)
    db.run(lambda s: job_starts.commit_decision(s, Start(same[0], node, (0,)), Events()))
    cache = planner_view.SpecCache()
    cached = db.run(lambda s: planner_view.live_view(s, cache))
    fresh = db.run(planner_view.live_view)

    def comparable(view: planner_view.LiveView) -> list[tuple[object, ...]]:
        return [(j.id, j.tenant, j.priority, j.gpus, j.node, j.gpu_indices, j.duration_s) for j in view.jobs]

    assert comparable(cached) == comparable(fresh)
    assert [j.id for j in cached.jobs] == [*same, other]
    assert cached.specs == fresh.specs
    # The three jobs of one spec share one parsed mapping; the other job has its own.
    assert cached.specs[same[1]] is cached.specs[same[2]] is cached.specs[same[0]]
    assert cached.specs[other] is not cached.specs[same[1]] and cached.specs[other]["priority"] == 9
    # A second read through the same cache parses nothing new and sees the same queue.
    again = db.run(lambda s: planner_view.live_view(s, cache))
    assert comparable(again) == comparable(cached) and again.specs[same[2]] is cached.specs[same[2]]


def test_a_full_spec_cache_forgets_the_digest_used_longest_ago() -> None:
    cache = planner_view.SpecCache(size=2)
    for digest, gpus in (("a", 1), ("b", 2)):
        cache.get(digest, {"name": digest, "gpus": gpus})
    cache.get("a")  # used again: "b" is now the oldest
    cache.get("c", {"name": "c", "gpus": 4})
    assert "a" in cache and "c" in cache and "b" not in cache
    with pytest.raises(KeyError):
        cache.get("b")


def test_waiting_reasons_rewrite_only_changed_rows_and_only_while_pending(db: Database) -> None:
    tenant, node = setup_cluster(db)
    kept, changed, started = (submit(db, tenant) for _ in range(3))
    db.run(lambda s: job_starts.set_waiting_reasons(s, {kept: "waiting: one", changed: "waiting: two"}))
    db.run(lambda s: job_starts.commit_decision(s, Start(started, node, (0,)), Events()))
    before = {job_id: xmin(db, job_id) for job_id in (kept, changed, started)}
    db.run(lambda s: job_starts.set_waiting_reasons(
        s, {kept: "waiting: one", changed: "waiting: three", started: "waiting: stale"}))
    assert xmin(db, kept) == before[kept]
    assert xmin(db, changed) != before[changed]
    assert xmin(db, started) == before[started]
    reasons = {j: db.run(lambda s, j=j: job_lifecycle.get_job(s, j).reason) for j in (kept, changed)}  # type: ignore[union-attr]
    assert reasons == {kept: "waiting: one", changed: "waiting: three"}


def test_saved_forecasts_replace_a_jobs_earlier_forecast(db: Database) -> None:
    tenant, _node = setup_cluster(db)
    a, b = submit(db, tenant), submit(db, tenant)
    first = {"planned_seconds": 60.0, "declared_seconds": None, "model": "declared", "p50_seconds": 0.0, "p90_seconds": 0.0}
    db.run(lambda s: alloc.save_forecasts(s, {a: first, b: first}))
    db.run(lambda s: alloc.save_forecasts(s, {b: {**first, "planned_seconds": 90.0, "model": "gbdt", "p90_seconds": 120.0}}))
    rows = {j: db.run(lambda s, j=j: alloc.job_forecast(s, j)) for j in (a, b)}
    assert (rows[a].planned_seconds, rows[a].model, rows[a].declared_seconds) == (60.0, "declared", None)  # type: ignore[union-attr]
    assert (rows[b].planned_seconds, rows[b].model, rows[b].p90_seconds) == (90.0, "gbdt", 120.0)  # type: ignore[union-attr]


def test_after_a_costly_plan_arrivals_wait_out_the_rest_and_are_planned_after_it(db: Database, redis_url: str) -> None:
    tenant, node = setup_cluster(db, gpus=2)
    submit(db, tenant)
    settings = Settings(plan_step_s=3600.0, plan_horizon=4, full_interval_s=0, api_addr="127.0.0.1:1")
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings), clock=lambda: 7200.0)

    async def cycles() -> tuple[str, str, str]:
        first = await loop.cycle()
        loop.memory.plan_cost_s = 3600.0  # as if that plan had cost an hour
        arrival = submit(db, tenant)
        resting = await loop.cycle()
        waited = db.run(lambda s: job_lifecycle.get_job(s, arrival).state)  # type: ignore[union-attr]
        loop.memory.plan_cost_s = 0.0  # the rest is over
        after = await loop.cycle()
        return first.planned, resting.planned + "|" + waited, after.planned

    try:
        first, resting, after = asyncio.run(cycles())
    finally:
        loop.leadership.release()
    assert first == "first plan of this leader"
    assert resting == "|PENDING"
    assert after != "" and "arriv" in after, after
