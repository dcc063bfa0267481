"""``rota bench overlap``'s figures: Rota's time is its own measurement, and the kept count is counted."""

from __future__ import annotations

from typing import Any

import pytest


def _case(baseline: float, again: float, rota: float, kept: bool) -> dict[str, Any]:
    return {"baseline_s": baseline, "baseline_again_s": again, "rota_s": rota, "plan_kept": kept}


def test_a_fallen_back_plan_reports_its_own_fresh_timing_not_the_baselines() -> None:
    from rota.bench.overlap_worker import case_times

    measured = {"baseline": 10.0e-3, "baseline_again": 10.4e-3, "rota": 11.0e-3,
                "compute_before": 4.0e-3, "compute_after": 4.5e-3}
    times = case_times(measured)
    # The old bench copied the baseline's 10 ms (and its compute-only step) into Rota's column
    # whenever the plan was the untransformed graph.
    assert times["rota_s"] == pytest.approx(11.0e-3)
    assert times["baseline_again_s"] == pytest.approx(10.4e-3)
    assert times["exposed_comm_after_s"] == pytest.approx(6.5e-3)
    assert times["exposed_comm_before_s"] == pytest.approx(6.0e-3)


def test_the_summary_counts_kept_plans_and_slower_steps_beyond_the_noise() -> None:
    from rota.bench.overlap import summarize

    cases = [
        _case(10.0, 10.2, 8.0, kept=True),
        _case(10.0, 10.1, 10.05, kept=False),  # slower by 0.5%, the noise is 1%: within it
        _case(10.0, 10.1, 11.0, kept=False),   # slower by 10%: beyond the 1% noise
        _case(10.0, 12.0, 11.0, kept=False),   # slower by 10%, the noise is 18%: within it
    ]
    assert summarize(cases) == {"plans": 4, "plans_kept": 1, "rota_slower": 3, "rota_slower_beyond_noise": 1}


def test_every_case_key_is_documented_in_the_bench_readme() -> None:
    from pathlib import Path

    from rota.bench.overlap import CASE_KEYS

    assert {"baseline_again_s", "plan_kept", "keep_margin"} <= set(CASE_KEYS)
    readme = (Path(__file__).resolve().parents[2] / "bench" / "README.md").read_text()
    assert "plans_kept" in readme
