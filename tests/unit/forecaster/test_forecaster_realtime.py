"""Weekly demand profiles: shape, recency, level, calibration, and GPUs under the swap cap."""

from __future__ import annotations

import numpy as np
import pytest

from rota.core.forecasting import realtime
from rota.core.forecasting.realtime import WEEK
from rota.core.planning.policy_fast import realtime_targets
from rota.core.planning.scenario import RealtimeApp

END = 168 * 3000  # a unix hour at a week boundary: hour-of-week index 0


def weekly(weeks: int, scale: float = 1.0) -> np.ndarray:
    """Traffic that is exactly weekly: 10 + hour of week (10..177)."""
    return np.tile(10.0 + np.arange(WEEK), weeks) * scale


def test_the_shape_weighs_each_week_half_the_one_after_it() -> None:
    values = np.concatenate([np.full(WEEK, 1.0), np.full(WEEK, 3.0)])
    # (0.5 x 1 + 1 x 3) / 1.5 per hour of the week (up to the within-week recency of each hour)
    shape = realtime.weekly_shape(values, END)
    assert shape[0] == pytest.approx((0.5 * 1 + 1 * 3) / 1.5)
    assert np.all((shape > 2.3) & (shape < 2.4))


def test_hours_without_samples_take_the_mean_of_the_rest() -> None:
    values = np.full(48, np.nan)
    values[-24:] = 4.0
    shape = realtime.weekly_shape(values, END)
    assert np.allclose(shape, 4.0)


def test_a_flat_history_forecasts_its_level() -> None:
    f = realtime.predict(np.full(2 * WEEK, 7.0), END, 24, beta=1.0, half_life=3.0)
    assert np.allclose(f, 7.0)


def test_an_exactly_weekly_history_is_forecast_exactly_with_the_full_weekly_swing() -> None:
    curve = realtime.fit(weekly(3), END, 24)
    assert curve.beta == 1.0
    assert np.allclose(curve.values, 10.0 + np.arange(24))


def test_the_level_follows_recent_traffic() -> None:
    values = weekly(3)
    values[-24:] *= 2  # the last day doubled
    f = realtime.predict(values, END, 24, beta=1.0, half_life=1.0)
    # The shape at those hours is (0.25 + 0.5 + 1 x 2) / 1.75 of the old value, so with the
    # recent hours dominating the level is 2 / (2.75 / 1.75) = 1.2727: hour 0 (10) -> 12.73.
    assert f[0] == pytest.approx(10 * 2 * 1.75 / 2.75, rel=0.001)


def test_calibration_prefers_the_recent_level_when_traffic_has_no_weekly_pattern() -> None:
    rng = np.random.default_rng(0)
    walk = 50 + np.cumsum(rng.normal(0, 2, 3 * WEEK))
    assert realtime.fit(walk, END, 24).beta == 0.0


def test_missing_history_is_an_error() -> None:
    with pytest.raises(ValueError):
        realtime.fit(np.full(WEEK, np.nan), END, 24)


def test_the_interval_brackets_the_forecast() -> None:
    rng = np.random.default_rng(1)
    noisy = weekly(4) * np.exp(rng.normal(0, 0.1, 4 * WEEK))
    c = realtime.fit(noisy, END, 24)
    assert all(lo <= v <= hi for lo, v, hi in zip(c.lower, c.values, c.upper, strict=True))


def test_series_places_samples_by_unix_hour() -> None:
    s = realtime.series({END - 1: 5.0, END - 3: 2.0, END: 9.0, END - 5000: 1.0}, END, hours=4)
    assert np.isnan(s[0]) and s[1] == 2.0 and np.isnan(s[2]) and s[3] == 5.0


@pytest.mark.parametrize(("need", "swap"), [
    ([1, 1, 6, 6, 2, 2], 2), ([5, 0, 0, 5], 1), ([0, 3, 0, 3, 0], 0), ([2, 2, 2], 4), ([8, 1, 8, 1, 8], 3),
])
def test_the_swap_cap_matches_the_allocators_realtime_targets(need: list[int], swap: int) -> None:
    app = RealtimeApp(id="chat", tenant="t", demand=tuple(need), max_swap=swap)
    assert realtime.swap_capped(need, swap) == realtime_targets(app)


def test_traffic_becomes_replica_gpus_raised_ahead_of_a_surge() -> None:
    # 100 requests/hour per GPU: 150 -> 2 GPUs, 600 -> 6; with at most 2 swaps a step, rise from step 0.
    assert realtime.to_gpus([150, 150, 600, 100], capacity=100, max_swap=2) == [2, 4, 6, 4]
    assert realtime.to_gpus([200.0], capacity=100, max_swap=1) == [2]  # exactly 2 replicas' worth
    with pytest.raises(ValueError):
        realtime.to_gpus([1.0], capacity=0, max_swap=1)


def test_gpu_counts_are_whole_replicas() -> None:
    assert realtime.to_gpus([0.0, 1.0, 99.9], capacity=100, max_swap=10) == [0, 1, 1]
