"""Executing a scenario on estimated durations: jobs run for their true durations, re-planned every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rota.core.planning import policy_fast
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.rolling import execute
from rota.core.planning.scenario import Scenario, from_dict, load


def scenario(*jobs: dict[str, Any], gpus: int = 4, horizon: int = 6) -> Scenario:
    return from_dict({"name": "t", "gpus": gpus, "horizon": horizon, "jobs": list(jobs)})


def job(id: str, duration: int, priority: int = 5, gpus: int = 4, arrival: int = 0, **kw: Any) -> dict[str, Any]:
    return {"id": id, "kind": "training", "gpus": gpus, "duration": duration, "priority": priority, "arrival": arrival, **kw}


def steps_of(grid: list[list[str | None]], job_id: str) -> list[int]:
    return sorted({t for row in grid for t, c in enumerate(row) if c == job_id})


def test_with_true_durations_the_executed_grid_is_the_plans() -> None:
    s = scenario(job("a", 3, priority=9), job("b", 2))
    grid = execute(s, {"a": 3, "b": 2}, policy_fast.plan)
    assert grid == policy_fast.plan(s).grid


def test_an_underestimated_job_keeps_running_and_the_next_one_waits_for_it() -> None:
    s = scenario(job("a", 3, priority=9), job("b", 2))
    grid = execute(s, {"a": 1, "b": 2}, policy_fast.plan)
    assert steps_of(grid, "a") == [0, 1, 2]
    assert steps_of(grid, "b") == [3, 4]
    assert violations(s, grid) == []


def test_gpus_freed_by_an_overestimated_job_are_used_at_the_next_step() -> None:
    s = scenario(job("a", 1, priority=9), job("b", 2))
    grid = execute(s, {"a": 5, "b": 2}, policy_fast.plan)
    assert steps_of(grid, "a") == [0]
    assert steps_of(grid, "b") == [1, 2]


def test_a_running_job_stays_where_it_is_and_realtime_demand_is_served() -> None:
    s = scenario(job("r", 3, gpus=2, running={"started": -1, "first_gpu": 0}),
                 {"id": "chat", "kind": "realtime", "demand": [2, 2, 2, 2, 2, 2], "max_swap": 2},
                 job("b", 2, gpus=2))
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
