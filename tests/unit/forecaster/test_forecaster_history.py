"""The history model: weighted quantiles by hand, online replay without peeking, recency and GPU count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rota.core.forecasting.history import (
    DurationHistory,
    Finished,
    HistoryConfig,
    Past,
    replay,
    weighted_quantiles,
)


def test_weighted_quantiles_by_hand() -> None:
    # weights 1, 1, 2 at 1, 2, 3: midpoints of the cumulative mass 0.125, 0.375, 0.75
    got = weighted_quantiles(np.array([3.0, 1.0, 2.0]), np.array([2.0, 1.0, 1.0]), [0.125, 0.375, 0.75, 0.5625])
    assert got.tolist() == pytest.approx([1.0, 2.0, 3.0, 2.5])


def test_no_forecast_below_min_jobs_then_the_recent_same_size_jobs_dominate() -> None:
    h = DurationHistory(HistoryConfig(half_life=5, other_gpus=0.1, hour_weight=0.0, min_jobs=3))
    for _ in range(2):
        h.add(Finished(100.0, 8, 0))
    assert h.predict(8, 0) is None
    for _ in range(20):
        h.add(Finished(10000.0, 8, 0))
        h.add(Finished(50.0, 4, 0))
    p8, p4 = h.predict(8, 0), h.predict(4, 0)
    assert p8 is not None and p4 is not None
    assert p8.p50_seconds == pytest.approx(10000.0) and p4.p50_seconds == pytest.approx(50.0)
    assert p8.p90_seconds >= p8.p50_seconds >= p8.p10_seconds


def test_replay_uses_only_jobs_finished_before_each_submission() -> None:
    # 25 jobs of 100 s finish by t=10,000; a job submitted at t=5 sees none of them.
    jobs = [Past(float(i), 10000.0, 100.0, 8, 0.0) for i in range(25)]
    jobs.append(Past(20000.0, 30000.0, 7.0, 8, 0.0))
    preds = replay(jobs, HistoryConfig(min_jobs=20))
    assert all(p is None for p in preds[:25])
    last = preds[-1]
    assert last is not None and last.p50_seconds == pytest.approx(100.0)


def test_a_bad_completion_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="seconds"):
        DurationHistory().add(Finished(math.nan, 8, 0))


def test_a_declared_limit_moves_the_forecast_by_how_loose_past_limits_were() -> None:
    # Past jobs ran 100 s or 10,000 s, equally often; each declared 4x its run. A job declaring
    # 400 s is then a 100 s job, one declaring 40,000 s a 10,000 s job; without a limit, either.
    h = DurationHistory(HistoryConfig(half_life=1e9, hour_weight=0.0, min_jobs=10, min_declared=10))
    for _ in range(20):
        h.add(Finished(100.0, 8, 0, declared=400.0))
        h.add(Finished(10000.0, 8, 0, declared=40000.0))
    short, long_ = h.predict(8, 0, declared=400.0), h.predict(8, 0, declared=40000.0)
    assert short is not None and long_ is not None
    assert short.p50_seconds == pytest.approx(100.0) and long_.p50_seconds == pytest.approx(10000.0)
    blind = h.predict(8, 0)
    assert blind is not None and blind.p90_seconds / blind.p10_seconds > 50  # both kinds stay possible
