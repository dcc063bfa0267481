"""Trials as guests in running pipelines' bubbles, in Postgres: the lent GPUs' key, the
planner's blindness to guests, the takeover once the host ends, and the ledger's bill."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import test_jobs_repository as jobs_tests
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from test_jobs_repository import claims, load, place, placements, register, report, submit, transitions

from rota.cluster import guest_leases, planner_view, queries
from rota.cluster.job_lifecycle import Events
from rota.cluster.models import GpuGuestRow
from rota.common.db import Database
from rota.core import jobstate as js
from rota.core.planning.guests import GuestStart
from rota.ledger.collector import collect_all
from rota.ledger.models import UsageRow

BUBBLES = {"step_s": 0.2, "bubble_s": 0.08}  # a host whose stage waits 40% of its step


# The same database and tenant fixtures as the single-node tests.
db = jobs_tests.db
tenant = jobs_tests.tenant


def running_host(db: Database, tenant: str, node: str, progress: dict[str, object] | None = None) -> Any:
    host = place(db, submit(db, tenant, gpus=2), node, (0, 1))
    report(db, node, host, js.RUNNING, progress=BUBBLES if progress is None else progress)
    return load(db, host.id)


def guest(db: Database, trial_id: str, host: Any, gpus: tuple[int, ...] = (0,)) -> Any:
    start = GuestStart(trial_id, host.id, host.node, gpus, 0.4)
    return db.run(lambda s: guest_leases.commit_guest(s, start, Events()))


def lent(db: Database, job_id: str) -> list[tuple[str, int, str]]:
    return [(r.node, r.gpu_index, r.host_job_id) for r in db.run(lambda s: s.scalars(
        select(GpuGuestRow).where(GpuGuestRow.job_id == job_id).order_by(GpuGuestRow.gpu_index)).all())]


def hosts_on(db: Database, node: str) -> dict[str, Any]:
    return {h.job_id: h for h in db.run(guest_leases.bubble_hosts) if h.node == node}


def test_a_running_job_that_reports_bubbles_is_a_host_and_one_that_does_not_is_not(db: Database, tenant: str) -> None:
    node = register(db, gpus=4)
    host = running_host(db, tenant, node)
    plain = place(db, submit(db, tenant, gpus=2), node, (2, 3))
    report(db, node, plain, js.RUNNING, progress={"step": 3})
    found = hosts_on(db, node)
    assert list(found) == [host.id]
    assert found[host.id].gpus == (0, 1) and found[host.id].bubble_fraction == pytest.approx(0.4)


def test_a_guest_runs_on_its_hosts_gpus_unseen_by_the_planner_and_one_per_gpu(db: Database, tenant: str) -> None:
    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    trial_id = submit(db, tenant, kind="trial")
    placed = guest(db, trial_id, host)
    assert placed is not None and (placed.node, placed.gpu_indices, placed.guest_of) == (node, [0], host.id)
    assert placed.state == js.SCHEDULED and placed.epoch > host.epoch
    assert "guest in the pipeline bubbles of " + host.id in transitions(db, trial_id)[-1][2]
    # The host keeps its claims; the guest holds none, only the lent GPU.
    assert {(n, g, j) for n, g, j, _e in claims(db, node=node)} == {(node, 0, host.id), (node, 1, host.id)}
    assert lent(db, trial_id) == [(node, 0, host.id)]
    [p] = placements(db, trial_id)
    assert (p.guest_of, p.promoted_at, p.epoch) == (host.id, None, placed.epoch)
    # The planner sees the host on both GPUs and not the guest at all.
    view = db.run(planner_view.live_view)
    mine = {j.id: j for j in view.jobs if j.id in (host.id, trial_id)}
    assert list(mine) == [host.id] and mine[host.id].gpu_indices == (0, 1)
    assert hosts_on(db, node)[host.id].lent == frozenset({0})
    # The agent is told to run it, as a guest of that host.
    assert trial_id in [j.id for j in report(db, node, host, js.RUNNING, progress=BUBBLES)]
    # A second guest on the same GPU is refused by the key; the trial that is no longer pending is not placed again.
    other = submit(db, tenant, kind="trial")
    with pytest.raises(IntegrityError):
        guest(db, other, host, (0,))
    assert load(db, other).state == js.PENDING
    assert guest(db, trial_id, host, (1,)) is None


def test_no_guest_for_a_host_that_no_longer_runs_there(db: Database, tenant: str) -> None:
    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    report(db, node, host, js.SUCCEEDED)
    trial_id = submit(db, tenant, kind="trial")
    assert guest(db, trial_id, host) is None and load(db, trial_id).state == js.PENDING


def test_once_the_host_ends_its_guest_takes_the_gpus_over_and_is_billed_from_then(db: Database, tenant: str) -> None:
    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    trial_id = submit(db, tenant, kind="trial")
    placed = guest(db, trial_id, host)
    report(db, node, placed, js.RUNNING)
    assert trial_id not in db.run(guest_leases.orphaned_guests)
    collect_all(db)
    usage = lambda job_id: db.run(lambda s: s.scalars(select(UsageRow).where(UsageRow.job_id == job_id)).all())  # noqa: E731
    assert usage(host.id) and not usage(trial_id)  # the host pays for its GPUs, bubbles and all
    # The host ends: nothing holds GPU 0 but the guest, which is due to take it over ...
    report(db, node, host, js.SUCCEEDED)
    assert trial_id in db.run(guest_leases.orphaned_guests)
    events = Events()
    assert db.run(lambda s: guest_leases.take_over(s, trial_id, events))
    assert [e for _j, e, _s in events.items] == ["promoted"]
    # ... under the same placement and epoch (its agent keeps it running), seen by the planner now.
    after = load(db, trial_id)
    assert (after.state, after.guest_of, after.epoch, after.gpu_indices) == (js.RUNNING, "", placed.epoch, [0])
    assert claims(db, job_id=trial_id) == [(node, 0, trial_id, placed.epoch)] and lent(db, trial_id) == []
    [p] = placements(db, trial_id)
    assert p.promoted_at is not None
    assert [j.id for j in db.run(planner_view.live_view).jobs if j.id == trial_id] == [trial_id]
    assert not db.run(lambda s: guest_leases.take_over(s, trial_id, Events()))  # a repeat changes nothing
    collect_all(db)
    [row] = usage(trial_id)
    assert row.start_at == p.promoted_at  # billed from the takeover, not from its placement
    report(db, node, after, js.SUCCEEDED)
    assert load(db, trial_id).state == js.SUCCEEDED and claims(db, job_id=trial_id) == []


def test_a_guest_that_ends_first_frees_its_lent_gpu_and_is_never_billed(db: Database, tenant: str) -> None:
    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    trial_id = submit(db, tenant, kind="trial")
    placed = guest(db, trial_id, host, (1,))
    report(db, node, placed, js.SUCCEEDED)
    assert load(db, trial_id).state == js.SUCCEEDED and lent(db, trial_id) == []
    assert hosts_on(db, node)[host.id].lent == frozenset()
    collect_all(db)
    assert not db.run(lambda s: s.scalars(select(UsageRow).where(UsageRow.job_id == trial_id)).all())


def test_a_dead_node_loses_its_guests_with_its_hosts(db: Database, tenant: str) -> None:
    from test_jobs_repository import _silence

    from rota.cluster import node_lifecycle

    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    trial_id = submit(db, tenant, kind="trial", restart="on-failure", max_retries=1)
    guest(db, trial_id, host)
    _silence(db, node, 600)
    dead = db.run(lambda s: node_lifecycle.declare_dead_nodes(s, 30, Events()))
    assert node in [d.name for d in dead]
    again = load(db, trial_id)
    assert (again.state, again.guest_of, again.node, lent(db, trial_id)) == (js.PENDING, "", None, [])


def test_the_allocators_cycles_place_a_waiting_trial_once_bubbles_open_and_hand_it_the_gpus(
        private_db: Database, redis_url: str) -> None:
    import asyncio

    from allocator_fixtures import setup_cluster
    from allocator_fixtures import submit as submit_job

    from rota.allocator.loop import SchedulingLoop
    from rota.allocator.peers import Peers
    from rota.common.agents import AgentClients
    from rota.common.config import Settings
    from rota.common.live import LiveState, connect_redis

    db = private_db
    tenant, node = setup_cluster(db, gpus=2)
    settings = Settings(plan_step_s=600.0, plan_horizon=4, full_interval_s=0, api_addr="127.0.0.1:1")
    live = LiveState(connect_redis(redis_url), "rota-test-" + secrets.token_hex(3))
    loop = SchedulingLoop(settings, db, live, AgentClients("token"), Peers.from_settings(settings), clock=lambda: 6000.0)

    async def cycle() -> Any:
        loop.memory.plan_cost_s = 0.0  # no rest after a plan: each cycle here plans if anything changed
        return await loop.cycle()

    async def scenario() -> None:  # one event loop: the agent channels belong to it
        host_id = submit_job(db, tenant, gpus=2, duration_seconds=300.0)
        assert (await cycle()).placed == 1
        report(db, node, load(db, host_id), js.RUNNING, progress={"step": 1})
        trial_id = submit_job(db, tenant, kind="trial", gpus=1, duration_seconds=60.0)
        assert (await cycle()).planned.startswith("arrival")
        assert load(db, trial_id).state == js.PENDING  # no free GPU, and no bubbles reported yet
        # The host reports its bubbles: nothing a plan looks at changed, yet the next cycle places the trial.
        report(db, node, load(db, host_id), js.RUNNING, progress=BUBBLES)
        assert (await cycle()).planned == ""
        placed = load(db, trial_id)
        assert (placed.state, placed.guest_of, placed.gpu_indices) == (js.SCHEDULED, host_id, [0])
        assert (await cycle()).planned == ""  # the guest leaving the queue is no change to re-plan for
        # The host ends: the next cycle gives the guest its GPU, and the plan sees it holding it.
        report(db, node, placed, js.RUNNING)
        report(db, node, load(db, host_id), js.SUCCEEDED)
        await cycle()
        after = load(db, trial_id)
        assert (after.state, after.guest_of, after.epoch) == (js.RUNNING, "", placed.epoch)
        assert claims(db, job_id=trial_id) == [(node, 0, trial_id, placed.epoch)]

    try:
        asyncio.run(scenario())
    finally:
        loop.leadership.release()


def test_a_trial_that_says_its_gpu_memory_waits_for_a_stage_that_leaves_that_much(db: Database, tenant: str) -> None:
    from rota.allocator.guest_placement import GuestPlacement

    node = register(db, gpus=2)
    host = running_host(db, tenant, node, {**BUBBLES, "bubble_free_mb": 256})
    assert hosts_on(db, node)[host.id].free_mb == 256.0
    trial_id = submit(db, tenant, kind="trial", gpu_memory_mb=512)
    [waiting] = [j for j in db.run(planner_view.live_view).jobs if j.id == trial_id]
    assert waiting.gpu_memory_mb == 512  # from the stored spec, as the planner reads it
    placement = GuestPlacement(db, [waiting])
    assert placement.between_plans(Events()) == [] and load(db, trial_id).state == js.PENDING
    report(db, node, host, js.RUNNING, progress={**BUBBLES, "bubble_free_mb": 4096})
    [(_address, launch)] = placement.between_plans(Events())
    assert launch.job.id == trial_id and launch.job.guest_of == host.id and launch.job.spec.gpu_memory_mb == 512
    assert placement.waiting == [] and load(db, trial_id).guest_of == host.id


def test_a_host_names_its_running_guests_and_a_tenant_sees_only_its_own(db: Database, tenant: str) -> None:
    from rota.api import repository as api

    other = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, other, 1.0, secrets.token_hex(32)))
    node = register(db, gpus=2)
    host = running_host(db, tenant, node)
    mine, theirs = submit(db, tenant, kind="trial"), submit(db, other, kind="trial")
    guest(db, mine, host, (0,))
    guest(db, theirs, host, (1,))
    assert db.run(lambda s: queries.guests_of(s, host.id)) == sorted([mine, theirs])  # the admin's view
    assert db.run(lambda s: queries.guests_of(s, host.id, tenant)) == [mine]
    report(db, node, load(db, mine), js.SUCCEEDED)
    assert db.run(lambda s: queries.guests_of(s, host.id)) == [theirs]  # a finished guest is gone from the list
