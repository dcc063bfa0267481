"""A job that has run before: its own runs answer from the first one, as uncertain as so few runs are."""

from __future__ import annotations

import pytest

from rota.core.forecasting.own_runs import from_own_runs, run_key, t_quantile
from rota.core.forecasting.predict import Completion, Forecaster

SPEC = {"name": "train-small", "tenant": "acme", "kind": "training", "gpus": 1, "command": ["python", "t.py"],
        "features": {"epochs": 1}, "priority": 5, "duration_seconds": 120.0}
KEY = run_key("acme", SPEC)


def test_t_quantiles_match_the_tables() -> None:
    # Student t, 0.9 quantile: 1.886 (2 dof), 1.440 (6), 1.325 (20)
    assert t_quantile(0.9, 2) == pytest.approx(1.886, rel=0.01)
    assert t_quantile(0.9, 6) == pytest.approx(1.440, rel=0.005)
    assert t_quantile(0.9, 20) == pytest.approx(1.325, rel=0.002)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)


def test_one_run_is_the_forecast_with_a_wide_interval_and_five_narrow_it() -> None:
    one = from_own_runs([7.0])
    assert one.model == "own-runs" and one.p50_seconds == pytest.approx(7.0)
    assert 1.7 < one.p90_seconds / one.p50_seconds < 2.2
    five = from_own_runs([7.0] * 5)
    assert five.p50_seconds == pytest.approx(7.0)
    assert 1.1 < five.p90_seconds / five.p50_seconds < one.p90_seconds / one.p50_seconds
    spread = from_own_runs([4.0, 7.0, 12.0, 5.0, 9.0])  # runs that differ widen it again
    assert spread.p90_seconds / spread.p50_seconds > five.p90_seconds / five.p50_seconds
    with pytest.raises(ValueError, match="seconds"):
        from_own_runs([])


def test_the_run_key_ignores_what_does_not_change_the_work() -> None:
    assert KEY is not None and KEY.startswith("acme/train-small/")
    assert run_key("acme", {**SPEC, "priority": 9, "duration_seconds": 999.0, "features": {"epochs": 1.0}}) == KEY
    assert run_key("acme", {**SPEC, "command": ["python", "t.py", "--big"]}) != KEY
    assert run_key("other", SPEC) != KEY
    assert run_key("acme", {**SPEC, "name": ""}) is None


def test_the_forecaster_answers_from_own_runs_before_the_prior_or_declared() -> None:
    history = [Completion("training", {}, 1, 7.0, 120.0, KEY), Completion("training", {}, 1, 7.4, 120.0, KEY),
               Completion("training", {}, 1, 300.0, 120.0, "acme/other/x")]
    f = Forecaster(history).predict_spec(SPEC)
    assert f.prediction.model == "own-runs" and f.prediction.observations == 2
    assert 7.0 < f.seconds_at(0.5) < 7.4
    cold = Forecaster(history).predict_spec({**SPEC, "name": "never-ran", "features": {}})
    assert cold.prediction.model.startswith("declared")
