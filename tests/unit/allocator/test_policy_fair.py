"""The `fair` policy on the plan grid, and which leases yield at expiry (rota.core.planning.policy_fair)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from builders import batch_job, scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.twostage import JobView, TenantState
from rota.core.planning import policies, policy_fair, policy_fifo
from rota.core.planning.grid import Grid
from rota.core.planning.legality import violations
from rota.core.planning.policy_fair import Lease, lease_yields
from rota.core.planning.scenario import Scenario, from_dict

CFG = FairnessConfig()
DAY = CFG.window_s
NOW = 100 * 3600.0




def tenant(name: str, quota: int, allocated: int = 0, used: float = 0.0) -> TenantState:
    return TenantState(name, quota, allocated, used, quota * DAY)


def start_of(grid: Grid, job_id: str) -> int | None:
    steps = [t for row in grid for t, c in enumerate(row) if c == job_id]
    return min(steps) if steps else None


def tenants_at(s: Scenario, grid: Grid, step: int) -> Counter[str]:
    """GPUs each tenant holds at `step`."""
    owner = {j.id: j.tenant for j in s.batch}
    return Counter(owner[row[step]] for row in grid if row[step] is not None)


# The plan ------------------------------------------------------------------------------

def test_with_no_standings_two_tenants_with_equal_queues_alternate_where_fifo_drains_one_first() -> None:
    s = scenario(*(batch_job(f"a{i}", tenant="a") for i in range(3)), *(batch_job(f"b{i}", tenant="b") for i in range(3)), gpus=2)
    fair = policy_fair.plan(s).grid
    fifo = policy_fifo.plan(s).grid
    assert [tenants_at(s, fair, t) for t in range(3)] == [Counter(a=1, b=1)] * 3
    assert tenants_at(s, fifo, 0) == Counter(a=2)


def test_quotas_set_the_proportion_each_tenant_gets_of_the_first_steps() -> None:
    s = scenario(*(batch_job(f"a{i}", tenant="a") for i in range(8)), *(batch_job(f"b{i}", tenant="b") for i in range(8)), gpus=4)
    grid = policy_fair.plan(s, {"a": tenant("a", 3), "b": tenant("b", 1)}).grid
    assert tenants_at(s, grid, 0) == Counter(a=3, b=1)
    assert tenants_at(s, grid, 1) == Counter(a=3, b=1)


@pytest.mark.parametrize(
    ("standings", "first"),
    [
        pytest.param({"a": tenant("a", 4, 2, used=0.9 * 4 * DAY), "b": tenant("b", 4, 2, used=0.1 * 4 * DAY)}, "b",
                     id="the tenant with the lower used over entitled goes first"),
        pytest.param({"a": tenant("a", 4, 2, used=0.1 * 4 * DAY), "b": tenant("b", 4, 2, used=0.9 * 4 * DAY)}, "a",
                     id="and the other way round"),
        pytest.param({"a": tenant("a", 10, 5, used=0.0), "b": tenant("b", 10, 1, used=0.9 * 10 * DAY)}, "b",
                     id="a tenant holding under 20 percent of its quota goes before a lower usage ratio"),
    ],
)
def test_stage_one_picks_the_tenant(standings: dict[str, TenantState], first: str) -> None:
    s = scenario(batch_job("a1", tenant="a"), batch_job("b1", tenant="b"), gpus=1)
    grid = policy_fair.plan(s, standings, NOW).grid
    assert start_of(grid, f"{first}1") == 0


@pytest.mark.parametrize(
    ("views", "first"),
    [
        pytest.param({"old": JobView("old", "a", 1, 0.0, 50.0, 100.0, NOW - 60),
                      "new": JobView("new", "a", 1, 10.0, 10.0, 100.0, NOW - 60)}, "new",
                     id="the job with the lowest F goes first"),
        pytest.param({"old": JobView("old", "a", 1, 0.0, 90.0, 100.0, NOW - 5 * 3600),
                      "new": JobView("new", "a", 1, 10.0, 0.0, 100.0, NOW - 60)}, "old",
                     id="a job pending past the starvation threshold goes before a lower F"),
        pytest.param({}, "old", id="unknown to the ledger, jobs keep their queue order"),
    ],
)
def test_stage_two_picks_the_job_within_the_tenant(views: dict[str, JobView], first: str) -> None:
    s = scenario(batch_job("old", tenant="a"), batch_job("new", tenant="a"), gpus=1)
    grid = policy_fair.plan(s, {"a": tenant("a", 1)}, NOW, jobs=views).grid
    assert start_of(grid, first) == 0


def test_running_jobs_stay_pinned_and_a_job_that_never_fits_is_reported_unplaced() -> None:
    # `run` holds GPU 1 for the whole horizon, so a 2-GPU block never frees up.
    s = scenario(batch_job("run", tenant="a", duration=6, running={"started": 0, "first_gpu": 1}),
                 batch_job("wide", tenant="b", gpus=2), batch_job("next", tenant="b"), gpus=2)
    plan = policy_fair.plan(s)
    assert [row[0] for row in plan.grid] == ["next", "run"]
    assert plan.stats == {"placed": 1, "unplaced": 1}
    assert violations(s, plan.grid) == []


def test_fair_is_a_registered_policy() -> None:
    assert "fair" in policies.NAMES
    s = scenario(batch_job("a1", tenant="a"), batch_job("b1", tenant="b"), gpus=2)
    assert policies.get("fair")(s).grid == policy_fair.plan(s).grid


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    gpus = draw(st.sampled_from([2, 4, 8]))
    horizon = draw(st.integers(2, 6))
    jobs: list[dict[str, Any]] = []
    for i in range(draw(st.integers(0, 2))):
        demand = draw(st.lists(st.integers(0, gpus // 2), min_size=horizon, max_size=horizon))
        jobs.append({"id": f"r{i}", "kind": "realtime", "tenant": "rt", "demand": demand,
                     "max_swap": draw(st.integers(0, 3))})
    taken: set[int] = set()
    for i in range(draw(st.integers(1, 10))):
        size = draw(st.sampled_from([s for s in (1, 2, 4) if s <= gpus]))
        duration = draw(st.integers(1, horizon + 1))
        j = batch_job(f"j{i}", tenant=draw(st.sampled_from("abc")), gpus=size, duration=duration,
                      arrival=draw(st.integers(0, horizon)), priority=draw(st.integers(1, 10)))
        free = [f for f in range(0, gpus, size) if not taken & set(range(f, f + size))]
        if free and draw(st.booleans()):
            first = draw(st.sampled_from(free))
            taken |= set(range(first, first + size))
            j["running"] = {"started": -draw(st.integers(0, duration - 1)), "first_gpu": first}
        jobs.append(j)
    return from_dict({"name": "random", "gpus": gpus, "horizon": horizon, "jobs": jobs})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.dictionaries(st.sampled_from("abc"), st.tuples(st.integers(0, 8), st.floats(0, 2))))
def test_every_fair_grid_is_legal_whatever_the_standings(s: Scenario, raw: dict[str, tuple[int, float]]) -> None:
    standings = {t: TenantState(t, q, 0, r * max(q, 1) * DAY, q * DAY) for t, (q, r) in raw.items()}
    assert violations(s, policy_fair.plan(s, standings, NOW).grid) == []


# Lease expiry ----------------------------------------------------------------------------

LONG_AGO = NOW - 2 * CFG.lease_s


def lease(id: str, tenant: str, gpus: int = 1, started: float = LONG_AGO, **kw: Any) -> Lease:
    return Lease(id, tenant, gpus, started, kw.pop("preemptible", True), kw.pop("restart", "on-failure"), **kw)


def waiting(id: str, tenant: str, gpus: int = 1, since: float = NOW - 60) -> JobView:
    return JobView(id, tenant, gpus, since, 0.0, 10.0, since)


OVER = {"hog": tenant("hog", 2, allocated=4), "poor": tenant("poor", 2, allocated=0)}
HOLDS_ONE = {"hog": tenant("hog", 2, allocated=4), "poor": tenant("poor", 2, allocated=1)}


@pytest.mark.parametrize(
    ("leases", "queue", "tenants", "free", "expected"),
    [
        pytest.param([lease("h1", "hog")], [waiting("p1", "poor")], OVER, 0, ["h1"],
                     id="an expired preemptible lease of an over-quota tenant yields to an under-served job"),
        pytest.param([lease("h1", "hog", preemptible=False)], [waiting("p1", "poor")], OVER, 0, [],
                     id="a job that is not preemptible never yields"),
        pytest.param([lease("h1", "hog", restart="never")], [waiting("p1", "poor")], OVER, 0, [],
                     id="a job without restart on-failure that cannot be paused never yields"),
        pytest.param([lease("h1", "hog", restart="never", pausable=True)], [waiting("p1", "poor")], OVER, 0, ["h1"],
                     id="a job with a checkpoint image yields by a pause whatever its restart policy"),
        pytest.param([lease("h1", "hog", preemptible=False, pausable=True)], [waiting("p1", "poor")], OVER, 0, [],
                     id="a job that can be paused but is not preemptible never yields"),
        pytest.param([lease("h1", "hog", started=NOW - CFG.lease_s / 2)], [waiting("p1", "poor")], OVER, 0, [],
                     id="a lease that has not expired does not yield"),
        pytest.param([lease("h1", "hog", started=NOW - 100, lease_start=NOW - 2 * CFG.lease_s)],
                     [waiting("p1", "poor")], OVER, 0, [],
                     id="a job restarted within the delay threshold is not preempted again"),
        pytest.param([lease("h1", "hog", started=LONG_AGO - CFG.lease_s, lease_start=NOW - 60)],
                     [waiting("p1", "poor")], OVER, 0, [],
                     id="a renewed lease counts from its renewal"),
        pytest.param([lease("h1", "hog")], [waiting("p1", "poor")],
                     {"hog": tenant("hog", 4, allocated=4), "poor": tenant("poor", 2)}, 0, [],
                     id="a tenant within its quota does not yield"),
        pytest.param([lease("h1", "hog")], [waiting("p1", "poor")], OVER, 1, [],
                     id="free GPUs serve the waiting job before anyone yields"),
        pytest.param([lease("h1", "hog", 4)], [waiting("p1", "poor", 4)], HOLDS_ONE, 0, [],
                     id="a waiting job that would take its tenant over quota takes nothing"),
        pytest.param([lease("h1", "hog", 4)], [waiting("p1", "poor", 4, since=NOW - CFG.starvation_s)], HOLDS_ONE,
                     0, ["h1"], id="unless it is starving"),
        pytest.param([lease("h1", "hog", 4)], [waiting("p1", "poor", 4)], OVER, 0, ["h1"],
                     id="or wider than the whole quota of a tenant that holds nothing"),
        pytest.param([lease("h1", "hog"), lease("h2", "hog")], [waiting("p1", "poor"), waiting("p2", "poor")],
                     {"hog": tenant("hog", 2, allocated=3), "poor": tenant("poor", 2)}, 0, ["h1"],
                     id="yields stop once the over-quota tenant is back at its quota"),
        pytest.param([lease("h1", "hog"), lease("h2", "hog")], [waiting("p1", "poor", 2)],
                     {"hog": tenant("hog", 2, allocated=3), "poor": tenant("poor", 2)}, 0, [],
                     id="no yields are made that cannot cover the waiting job"),
        pytest.param([lease("h1", "hog", started=LONG_AGO), lease("g1", "greedy", started=LONG_AGO - 10)],
                     [waiting("p1", "poor")],
                     {"hog": tenant("hog", 2, allocated=4), "greedy": tenant("greedy", 2, allocated=3),
                      "poor": tenant("poor", 2)}, 0, ["h1"],
                     id="the most over-quota tenant yields first"),
        pytest.param([lease("h1", "hog", started=LONG_AGO), lease("h2", "hog", started=LONG_AGO - 10)],
                     [waiting("p1", "poor")], OVER, 0, ["h2"],
                     id="within it the longest-held lease yields first"),
    ],
)
def test_lease_yields(
    leases: list[Lease], queue: list[JobView], tenants: dict[str, TenantState], free: int, expected: list[str]
) -> None:
    got = lease_yields(leases, queue, tenants, free, NOW, CFG)
    assert [y.job_id for y in got] == expected
    for y in got:
        assert y.to_tenant != y.tenant and tenants[y.tenant].allocated > tenants[y.tenant].quota


def test_a_yield_names_the_job_it_makes_room_for_and_why() -> None:
    (y,) = lease_yields([lease("h1", "hog")], [waiting("p1", "poor")], OVER, 0, NOW, CFG)
    assert (y.to_job, y.to_tenant, y.gpus) == ("p1", "poor", 1)
    assert "over its quota" in y.reason and "p1" in y.reason


def test_fits_can_refuse_yields_whose_gpus_the_waiting_job_cannot_use() -> None:
    leases = [lease("h1", "hog", node="n1"), lease("h2", "hog", node="n2")]
    tenants = {"hog": tenant("hog", 1, allocated=4), "poor": tenant("poor", 4)}

    def same_node(job: JobView, freed: list[Lease] | Any) -> bool:
        return len({x.node for x in freed}) == 1 and sum(x.gpus for x in freed) >= job.gpus

    assert lease_yields(leases, [waiting("p1", "poor", 2)], tenants, 0, NOW, CFG, fits=same_node) == []
    assert [y.job_id for y in lease_yields(leases, [waiting("p1", "poor", 2)], tenants, 0, NOW, CFG)] == ["h1", "h2"]


# Inside a tenant within its quota: least attained service ------------------------------

TEN_GPU_H = 10 * 3600.0
WITHIN = {"lab": tenant("lab", 4, allocated=2)}


@pytest.mark.parametrize(
    ("leases", "queue", "expected"),
    [
        pytest.param([lease("long", "lab", used=TEN_GPU_H)], [waiting("new", "lab")], ["long"],
                     id="a long-served job yields to its own tenant's new job"),
        pytest.param([lease("short", "lab", used=600.0)], [waiting("new", "lab")], [],
                     id="not when both are in the lowest tier"),
        pytest.param([lease("long", "lab", used=TEN_GPU_H)], [], [], id="nor with nobody of its tenant waiting"),
        pytest.param([lease("a", "lab", used=TEN_GPU_H), lease("b", "lab", used=2 * TEN_GPU_H)],
                     [waiting("new", "lab")], ["b"], id="one new 1-GPU job evicts one job, the most served"),
        pytest.param([lease("long", "lab", used=TEN_GPU_H)], [waiting("new", "other")], [],
                     id="another tenant's job gets nothing from a tenant within its quota"),
    ],
)
def test_own_yields_at_lease_expiry(leases: list[Lease], queue: list[JobView], expected: list[str]) -> None:
    tenants = {**WITHIN, "other": tenant("other", 4)}
    got = lease_yields(leases, queue, tenants, 0, NOW, CFG)
    assert [y.job_id for y in got] == expected
    for y in got:
        assert y.to_tenant == y.tenant == "lab" and "least attained service" in y.reason


# Short bursts borrowing from another borrower (twostage.burst_borrower) ----------------

BOTH_OVER = {"hog": tenant("hog", 2, allocated=4), "bursty": tenant("bursty", 2, allocated=3)}


@pytest.mark.parametrize(
    ("leases", "left", "expected"),
    [
        pytest.param([lease("h1", "hog", used=TEN_GPU_H)], {"b1": 600.0}, ["h1"],
                     id="a short burst of an over-quota tenant takes a borrower's long-served expired lease"),
        pytest.param([lease("h1", "hog", used=TEN_GPU_H)], {}, [],
                     id="not without a forecast of its remaining time"),
        pytest.param([lease("h1", "hog", used=TEN_GPU_H)], {"b1": 2 * CFG.lease_s}, [],
                     id="nor when it is forecast to outlive the lease"),
        pytest.param([lease("h1", "hog", used=600.0)], {"b1": 600.0}, [],
                     id="nor from a lease still in the lowest attained tier"),
        pytest.param([lease("h1", "hog", used=TEN_GPU_H, started=NOW - CFG.lease_s / 2)], {"b1": 600.0}, [],
                     id="nor from a lease that has not expired"),
    ],
)
def test_bursts_at_lease_expiry(leases: list[Lease], left: dict[str, float], expected: list[str]) -> None:
    got = lease_yields(leases, [waiting("b1", "bursty")], BOTH_OVER, 0, NOW, CFG, left_s=left)
    assert [y.job_id for y in got] == expected
    for y in got:
        assert (y.tenant, y.to_tenant) == ("hog", "bursty") and "short burst" in y.reason


def test_a_burst_never_takes_from_a_tenant_within_its_quota() -> None:
    tenants = {"lab": tenant("lab", 4, allocated=4), "bursty": tenant("bursty", 2, allocated=3)}
    got = lease_yields([lease("l1", "lab", used=TEN_GPU_H)], [waiting("b1", "bursty")], tenants, 0, NOW, CFG,
                       left_s={"b1": 60.0})
    assert got == []
