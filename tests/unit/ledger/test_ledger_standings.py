"""Standings from recorded intervals (rota.core.fairness.standings) on cases worked out by hand."""

from __future__ import annotations

import pytest

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.standings import JobLife, Span, job_standings, tenant_standing, window_start

H = 3600.0
CFG = FairnessConfig()
NOW = 100 * H + 1800  # half past hour 100: the window holds buckets 77..100


def test_the_window_starts_at_the_oldest_of_its_24_hourly_buckets() -> None:
    assert window_start(NOW, CFG) == 77 * H
    assert window_start(100 * H, CFG) == 77 * H  # the bucket holding `now` counts from its start


def test_entitled_is_quota_times_the_window_and_deserved_caps_demand_at_the_quota() -> None:
    # Quota 2. A 4-GPU job waits from 90 h, runs 93-95 h; a 1-GPU job waits from 92 h and
    # runs from 96 h until now.
    demand = [Span(90 * H, 95 * H, 4), Span(92 * H, NOW, 1)]
    running = [Span(93 * H, 95 * H, 4), Span(96 * H, NOW, 1)]
    st = tenant_standing("a", 2, 0.0, NOW, demand, running, CFG)
    assert st.quota == 2
    assert st.entitled == pytest.approx(2 * (NOW - 77 * H))
    # 90-92 h: demand 4, capped at 2; 92-95 h: demand 5, capped at 2; 95 h-now: demand 1.
    assert st.deserved == pytest.approx(2 * 2 * H + 2 * 3 * H + 1 * (NOW - 95 * H))
    assert st.used == pytest.approx(4 * 2 * H + 1 * (NOW - 96 * H))
    assert st.fairness == pytest.approx(st.used / st.deserved)


def test_spans_are_clipped_to_the_window_and_older_ones_are_forgotten() -> None:
    demand = [Span(10 * H, 20 * H, 8), Span(70 * H, 80 * H, 3)]
    running = [Span(10 * H, 20 * H, 8), Span(76 * H, 78 * H, 2)]
    st = tenant_standing("a", 2, 0.0, NOW, demand, running, CFG)
    assert st.deserved == pytest.approx(2 * 3 * H)  # only 77-80 h counts, capped at 2
    assert st.used == pytest.approx(2 * 1 * H)  # only 77-78 h


def test_a_tenant_younger_than_the_window_is_entitled_only_since_it_exists() -> None:
    st = tenant_standing("new", 3, 99 * H, NOW, [], [], CFG)
    assert st.entitled == pytest.approx(3 * (NOW - 99 * H))
    assert st.deserved == 0.0 and st.fairness == 1.0  # nothing deserved: F is 1


def test_a_tenant_that_wants_nothing_deserves_nothing_and_one_that_ran_beyond_deserves_f_above_one() -> None:
    # Borrowing: 4 GPUs demanded and used with a quota of 1 deserves only 1 GPU's worth.
    st = tenant_standing("b", 1, 0.0, NOW, [Span(99 * H, NOW, 4)], [Span(99 * H, NOW, 4)], CFG)
    assert st.fairness == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("jobs", "quota", "now", "expected"),
    [
        pytest.param(
            # Quota 4 split 2/2 while both are active; b alone gets s = 4 > n = 2 after a leaves.
            [JobLife("a", 2, 1.0, 0.0, 100.0), JobLife("b", 2, 1.0, 0.0)], 4, 300.0,
            {"a": 2 * 100.0, "b": 2 * 100.0 + 2 * 200.0},
            id="a job's share grows when a sibling finishes, but never past its own GPUs",
        ),
        pytest.param(
            # Priorities weigh the share: s_a = 3/4 * 4 = 3, s_b = 1.
            [JobLife("a", 4, 3.0, 0.0), JobLife("b", 4, 1.0, 0.0)], 4, 100.0,
            {"a": 3 * 100.0, "b": 1 * 100.0},
            id="weights split the quota in proportion",
        ),
        pytest.param(
            # b arrives at 50: a had the whole quota (capped at its 1 GPU) before.
            [JobLife("a", 1, 1.0, 0.0), JobLife("b", 8, 1.0, 50.0)], 2, 150.0,
            {"a": 1 * 150.0, "b": 1 * 100.0},
            id="deserved counts from arrival, pending or running",
        ),
        pytest.param(
            [JobLife("a", 2, 1.0, 0.0)], 0, 100.0, {"a": 0.0},
            id="a tenant without quota deserves nothing",
        ),
    ],
)
def test_job_deserved_replays_arrivals_and_departures(
    jobs: list[JobLife], quota: int, now: float, expected: dict[str, float]
) -> None:
    got = job_standings(quota, jobs, {}, now)
    assert {k: v.deserved for k, v in got.items()} == pytest.approx(expected)


def test_job_fairness_is_used_over_deserved() -> None:
    got = job_standings(2, [JobLife("a", 1, 1.0, 0.0)], {"a": 50.0}, 100.0)
    assert got["a"].used == 50.0 and got["a"].fairness == pytest.approx(0.5)
