"""`rota sim --durations`: what the planner believes, EASY's shadow time, and that jobs run their true durations."""

from __future__ import annotations

import math
import random

import pytest

from rota.core.fairness.ltgf import FairnessConfig
from rota.sim.backfill import shadow
from rota.sim.engine import SimConfig, Simulator
from rota.sim.estimates import declared_limit, forecasts, with_durations
from rota.sim.orderings import POLICIES
from rota.sim.workload import Job


def test_shadow_time_by_hand() -> None:
    # 2 free, need 8: the 4-GPU job ending at 50 and the 4 ending at 30 free 10 by 50; 2 spare then.
    assert shadow(2, [(50.0, 4), (30.0, 4), (90.0, 8)], 8, 0.0) == (50.0, 2)
    assert shadow(8, [], 4, 7.0) == (7.0, 4)
    assert shadow(0, [(math.inf, 8)], 8, 0.0) == (math.inf, 0)


def test_declared_limits_never_fall_below_the_run_and_are_round() -> None:
    rng = random.Random(3)
    for seconds in (700.0, 5000.0, 90000.0, 4e6):
        for _ in range(50):
            limit = declared_limit(seconds, rng)
            assert limit >= seconds and limit % 3600 == 0


def test_unknown_mode_is_named() -> None:
    with pytest.raises(ValueError, match="--durations"):
        with_durations([], "psychic")


def _run(jobs: list[Job], policy: str) -> dict[str, float]:
    runs = Simulator(jobs, {"t": 1.0}, SimConfig(8, 8, FairnessConfig()), POLICIES[policy]()).run()
    return {r.job.id: r.end_s for r in runs}


def test_easy_backfills_a_short_job_only_when_the_plan_knows_it_is_short() -> None:
    # A 4-GPU job runs 0..100; the 8-GPU head waits for it; a 4-GPU 50 s job fits beside.
    jobs = [Job("long", "t", 0.0, 100.0, 4), Job("head", "t", 1.0, 10.0, 8), Job("short", "t", 2.0, 50.0, 4)]
    known = _run(jobs, "easy")
    assert known["short"] == pytest.approx(52.0) and known["head"] == pytest.approx(110.0)
    blind = _run(with_durations(jobs, "none"), "easy")  # FIFO: the short job waits behind the head
    assert blind["short"] == pytest.approx(160.0)
    assert blind["long"] == known["long"] == pytest.approx(100.0)  # jobs run their true durations


def test_sjf_orders_by_what_the_plan_believes() -> None:
    jobs = [Job("busy", "t", 0.0, 10.0, 8), Job("a", "t", 1.0, 100.0, 8, planned_s=5.0), Job("b", "t", 2.0, 20.0, 8)]
    ends = _run(jobs, "sjf")
    assert ends["a"] == pytest.approx(110.0) and ends["b"] == pytest.approx(130.0)
    assert _run([*jobs[:1], Job("a", "t", 1.0, 100.0, 8), jobs[2]], "sjf")["b"] == pytest.approx(30.0)


def test_forecast_plans_on_the_mean_of_the_limits_past_jobs_not_their_median() -> None:
    runs = [10.0] * 20 + [1000.0] * 5  # heavy tail: median 10, mean 208
    jobs = [Job(f"j{i}", "t", 2000.0 * i, d, 1) for i, d in enumerate([*runs, 10.0])]  # each ends before the next
    planned = forecasts(jobs, [86400.0] * len(jobs))
    assert planned[-1] == pytest.approx(sum(runs) / len(runs))
