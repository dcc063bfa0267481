"""Executing a scenario on estimated durations: jobs run for their true durations, re-planned every step."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import batch_job, realtime_app, scenario

from rota.core.planning import policy_fast
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.rolling import execute
from rota.core.planning.scenario import load


def steps_of(grid: list[list[str | None]], job_id: str) -> list[int]:
    return sorted({t for row in grid for t, c in enumerate(row) if c == job_id})


def test_with_true_durations_the_executed_grid_is_the_plans() -> None:
    s = scenario(batch_job("a", gpus=4, duration=3, priority=9), batch_job("b", gpus=4, duration=2))
    grid = execute(s, {"a": 3, "b": 2}, policy_fast.plan)
    assert grid == policy_fast.plan(s).grid


def test_an_underestimated_job_keeps_running_and_the_next_one_waits_for_it() -> None:
    s = scenario(batch_job("a", gpus=4, duration=3, priority=9), batch_job("b", gpus=4, duration=2))
    grid = execute(s, {"a": 1, "b": 2}, policy_fast.plan)
    assert steps_of(grid, "a") == [0, 1, 2]
    assert steps_of(grid, "b") == [3, 4]
    assert violations(s, grid) == []


def test_gpus_freed_by_an_overestimated_job_are_used_at_the_next_step() -> None:
    s = scenario(batch_job("a", gpus=4, duration=1, priority=9), batch_job("b", gpus=4, duration=2))
    grid = execute(s, {"a": 5, "b": 2}, policy_fast.plan)
    assert steps_of(grid, "a") == [0]
    assert steps_of(grid, "b") == [1, 2]


def test_a_running_job_stays_where_it_is_and_realtime_demand_is_served() -> None:
    s = scenario(batch_job("r", gpus=2, duration=3, running={"started": -1, "first_gpu": 0}),
                 realtime_app("chat", [2, 2, 2, 2, 2, 2], swap=2),
                 batch_job("b", gpus=2, duration=2))
    grid = execute(s, {"r": 1, "b": 4}, policy_fast.plan)
    assert steps_of(grid, "r") == [0, 1]
    assert all(row.count("chat") == 6 for row in grid[2:])
    assert steps_of(grid, "b") == [2, 3]
    assert violations(s, grid) == []


SCENARIOS = sorted((Path(__file__).resolve().parents[3] / "bench" / "scenarios").glob("*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_re_planning_every_step_on_true_durations_earns_the_one_shot_plans_value(path: Path) -> None:
    s = load(path)
    executed = measure(s, execute(s, {j.id: j.duration for j in s.batch}, policy_fast.plan))
    once = measure(s, policy_fast.plan(s).grid)
    assert (executed.value, executed.completed) == (once.value, once.completed)
