"""What each policy does on small scenarios built to show one rule at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import batch_job, realtime_app, scenario

from rota.bench import allocator as bench
from rota.core.planning import policy_fast, policy_fifo, policy_full
from rota.core.planning.grid import Grid
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import RealtimeApp


def start_and_block(grid: Grid, job_id: str) -> tuple[int, int] | None:
    cells = [(t, g) for g, row in enumerate(grid) for t, c in enumerate(row) if c == job_id]
    return (min(t for t, _ in cells), min(g for _, g in cells)) if cells else None


# FIFO --------------------------------------------------------------------------------

def test_fifo_reserves_each_realtime_peak_for_the_whole_horizon_on_the_top_gpus() -> None:
    grid = policy_fifo.plan(scenario(realtime_app("chat", [1, 3, 1, 1, 1, 1]))).grid
    assert [row.count("chat") for row in grid] == [0, 6, 6, 6]


def test_fifo_never_starts_a_job_before_one_that_arrived_earlier() -> None:
    s = scenario(batch_job("big", gpus=4, duration=2, arrival=1), batch_job("small", arrival=2), batch_job("first", duration=3))
    grid = policy_fifo.plan(s).grid
    # big waits for `first` (until step 3); small may not jump ahead of it into the free GPUs.
    assert start_and_block(grid, "first") == (0, 0)
    assert start_and_block(grid, "big") == (3, 0)
    assert start_and_block(grid, "small") == (5, 0)


def test_fifo_ignores_priority_and_blocks_the_queue_behind_a_job_that_never_fits() -> None:
    s = scenario(realtime_app("chat", [2] * 6), batch_job("wide", gpus=4, priority=1), batch_job("urgent", priority=10), gpus=4)
    grid = policy_fifo.plan(s).grid
    assert start_and_block(grid, "wide") is None and start_and_block(grid, "urgent") is None


def test_fifo_takes_the_lowest_aligned_block() -> None:
    s = scenario(batch_job("one", duration=6), batch_job("two", gpus=2, duration=2), gpus=4)
    assert start_and_block(policy_fifo.plan(s).grid, "two") == (0, 2)


# fast --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("demand", "swap", "expected"),
    [
        ([1, 1, 1, 5, 5, 1], 2, [1, 1, 3, 5, 5, 3]),  # ramps up ahead of the rise, eases down
        ([4, 0, 0, 0, 0, 0], 1, [4, 3, 2, 1, 0, 0]),
        ([2, 2, 2, 2, 2, 2], 0, [2, 2, 2, 2, 2, 2]),
        ([0, 0, 0, 0, 0, 3], 0, [3, 3, 3, 3, 3, 3]),  # no swaps at all: hold the peak throughout
    ],
    ids=["a rise beyond the cap", "a fall beyond the cap", "a flat curve", "a frozen app"],
)
def test_fast_gives_realtime_its_demand_within_the_swap_cap(demand: list[int], swap: int, expected: list[int]) -> None:
    app = RealtimeApp(id="chat", tenant="p", demand=tuple(demand), max_swap=swap)
    assert policy_fast.realtime_targets(app) == expected
    s = scenario(realtime_app("chat", demand, swap=swap), gpus=8)
    grid = policy_fast.plan(s).grid
    assert [sum(row[t] == "chat" for row in grid) for t in range(6)] == expected
    assert violations(s, grid) == [] and measure(s, grid).realtime_unmet == 0


def test_fast_places_higher_priority_first_into_the_earliest_free_block() -> None:
    s = scenario(batch_job("low", gpus=4, duration=3, priority=2), batch_job("high", gpus=4, duration=3, priority=9))
    grid = policy_fast.plan(s).grid
    assert start_and_block(grid, "high") == (0, 0) and start_and_block(grid, "low") == (3, 0)


def test_fast_backfills_a_small_job_past_a_waiting_big_one() -> None:
    s = scenario(batch_job("first", duration=3, running={"started": 0, "first_gpu": 0}),
                 batch_job("big", gpus=4, duration=2, arrival=1), batch_job("small", arrival=2))
    grid = policy_fast.plan(s).grid
    assert start_and_block(grid, "small") == (2, 1)  # beside `first`, before `big` starts
    assert start_and_block(grid, "big") == (3, 0)


def test_fast_keeps_a_whole_buddy_free_for_the_bigger_jobs_still_queued() -> None:
    # GPU 1 is pinned, so a 1-GPU job belongs at GPU 0 (its buddy is already broken),
    # leaving the 2-GPU block at 2-3 whole for the 2-GPU job.
    s = scenario(batch_job("pin", duration=6, running={"started": 0, "first_gpu": 1}),
                 batch_job("one", duration=6, priority=9), batch_job("pair", gpus=2, duration=6, priority=1))
    grid = policy_fast.plan(s).grid
    assert start_and_block(grid, "one") == (0, 0) and start_and_block(grid, "pair") == (0, 2)


def test_fast_keeps_running_jobs_exactly_where_they_are() -> None:
    s = scenario(batch_job("run", gpus=2, duration=4, running={"started": -2, "first_gpu": 2}), batch_job("next", gpus=2))
    grid = policy_fast.plan(s).grid
    assert [grid[g][:2] for g in (2, 3)] == [["run", "run"]] * 2 and grid[2][2] is None


def test_fast_beats_fifo_when_the_peak_reservation_idles_gpus() -> None:
    s = scenario(realtime_app("chat", [1, 1, 1, 1, 1, 4]), batch_job("a", gpus=2, duration=4), batch_job("b", gpus=2, duration=4))
    fifo, fast = measure(s, policy_fifo.plan(s).grid), measure(s, policy_fast.plan(s).grid)
    assert fast.value > fifo.value and fast.utilization > fifo.utilization


# full --------------------------------------------------------------------------------

def test_full_reports_its_objective_bound_and_gap_and_never_loses_to_its_hint() -> None:
    s = scenario(realtime_app("chat", [1, 1, 2, 2, 1, 1], swap=1), batch_job("a", gpus=2, duration=3, priority=3),
                 batch_job("b", gpus=2, duration=4, priority=8, arrival=1), batch_job("c", duration=2, priority=6), gpus=4)
    plan = policy_full.plan(s, time_limit=1.0, workers=1)
    assert violations(s, plan.grid) == []
    got = measure(s, plan.grid).objective
    assert plan.stats["objective"] == pytest.approx(got)
    assert got >= measure(s, policy_fast.plan(s).grid).objective - 1e-9
    assert plan.stats["status"] == "OPTIMAL"  # small enough to prove
    assert float(plan.stats["bound"]) >= got - 1e-3 and float(plan.stats["gap"]) >= 0


def test_full_trades_a_little_realtime_for_much_more_batch_value_when_the_weights_say_so() -> None:
    # One unmet realtime GPU-step costs 8; the 4-GPU job earns 10 x 4 per step for 5 steps.
    s = scenario(realtime_app("chat", [0, 0, 0, 0, 0, 1]), batch_job("wide", gpus=4, duration=6, priority=10), gpus=4)
    plan = policy_full.plan(s, time_limit=1.0, workers=1)
    assert start_and_block(plan.grid, "wide") == (0, 0)
    assert measure(s, plan.grid).objective > measure(s, policy_fast.plan(s).grid).objective


# bench -------------------------------------------------------------------------------

def test_bench_prints_the_spec_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "tiny", "gpus": 4, "horizon": 6, "jobs": [realtime_app("chat", [1] * 6), batch_job("a", gpus=2, duration=3)]}))
    assert bench.main(["--scenario", str(f), "--policy", "fifo,fast", "--json", "--repeat", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    (sc,) = out["scenarios"]
    assert sc["name"] == "tiny" and set(sc["policies"]) == {"fifo", "fast"}
    for p in sc["policies"].values():
        assert {"utilization", "value", "realtime_unmet", "completed", "runtime_ms", "grid"} <= set(p)
        assert len(p["grid"]) == 4 and all(len(row) == 6 for row in p["grid"])


def test_bench_prints_a_table_with_the_uplift_over_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "tiny", "gpus": 4, "horizon": 6, "jobs": [batch_job("a", gpus=2, duration=3)]}))
    assert bench.main(["--scenario", str(f), "--policy", "fifo,fast", "--repeat", "1", "--render", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs fifo" in out and "mean value uplift of fast over fifo" in out
    assert "A=a" in (tmp_path / "tiny.txt").read_text()


def test_bench_rejects_a_bad_scenario_or_policy_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"name": "x", "gpus": 3, "horizon": 2}))
    assert bench.main(["--scenario", str(f)]) == 2
    assert capsys.readouterr().err.strip().endswith("gpus: must be a power of two, got 3")
    assert bench.main(["--scenario", str(f), "--policy", "lifo"]) == 2
    assert "unknown policy 'lifo'" in capsys.readouterr().err
