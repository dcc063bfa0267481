"""Online conformal quantiles and the history model's calibrated P90."""

from __future__ import annotations

import math
import random

import pytest

from rota.core.forecasting.conformal import OnlineQuantile
from rota.core.forecasting.history import DurationHistory, Finished, HistoryConfig, Past, calibrated, replay
from rota.core.forecasting.training import QUANTILES, Prediction


def test_the_conformal_rank_is_ceil_n_plus_one_times_level() -> None:
    q = OnlineQuantile(0.9, window=100, min_scores=3)
    for s in (3.0, 1.0, 2.0):
        q.add(s)
    assert q.quantile() == math.inf  # ceil(4 * 0.9) = 4 > 3 scores: no finite bound is safe
    for s in range(4, 11):
        q.add(float(s))
    assert q.quantile() == 10.0  # n = 10: the ceil(9.9) = 10th smallest
    half = OnlineQuantile(0.5, window=100, min_scores=1)
    for s in (5.0, 1.0, 3.0, 2.0):
        half.add(s)
    assert half.quantile() == 3.0  # ceil(5 * 0.5) = 3rd smallest of 1, 2, 3, 5


def test_too_few_scores_give_no_correction_and_the_window_forgets() -> None:
    q = OnlineQuantile(0.5, window=3, min_scores=2)
    q.add(100.0)
    assert q.quantile() is None
    for s in (1.0, 1.0, 1.0):
        q.add(s)
    assert len(q) == 3 and q.quantile() == 1.0  # the 100 has left the window


@pytest.mark.parametrize("level, window, min_scores", [(0.0, 10, 1), (1.0, 10, 1), (0.5, 0, 1), (0.5, 10, 0)])
def test_bad_settings_are_refused(level: float, window: int, min_scores: int) -> None:
    with pytest.raises(ValueError):
        OnlineQuantile(level, window, min_scores)


def test_a_non_finite_score_is_refused() -> None:
    with pytest.raises(ValueError, match="score"):
        OnlineQuantile(0.9).add(math.nan)


def test_calibrated_moves_the_p90_by_the_shift_and_keeps_the_quantiles_in_order() -> None:
    offsets = tuple(0.5 * (q - 0.5) for q in QUANTILES)
    p = Prediction("history", 100.0, offsets)
    up = calibrated(p, 1.0)
    assert up.p50_seconds == 100.0 and up.p10_seconds == pytest.approx(p.p10_seconds)
    assert math.log(up.p90_seconds / p.p90_seconds) == pytest.approx(1.0)
    down = calibrated(p, -5.0)
    assert down.p90_seconds == pytest.approx(100.0)  # never below the P50
    assert list(down.log_offsets) == sorted(down.log_offsets)


def test_the_same_limit_decides_once_enough_jobs_declared_it() -> None:
    h = DurationHistory(HistoryConfig(min_jobs=5, min_same=3, min_declared=100, p90_level=0.0))
    for s in (1000.0, 1100.0, 1200.0, 50000.0, 60000.0):
        h.add(Finished(s, 8, 0, declared=7200.0 if s < 2000 else 86400.0))
    p = h.predict(8, 0, declared=7200.0)
    assert p is not None and p.p50_seconds == pytest.approx(1100.0)  # the three that declared 2 h
    other = h.predict(8, 0, declared=86400.0)  # two declared a day: fewer than min_same, the weighted history
    assert other is not None and other.p50_seconds > 1200.0


def test_replay_calibrates_a_p90_that_is_too_narrow() -> None:
    rng = random.Random(3)
    t, jobs = 0.0, []
    for _ in range(1500):  # durations log-normal, σ 1
        s = math.exp(rng.gauss(8.0, 1.0))
        jobs.append(Past(t, t + s, s, 8, 0.0))
        t += 600.0
    narrow = HistoryConfig(half_life=1.0, min_jobs=20, p90_level=0.0)  # a few effective jobs: the raw P90 is often low
    wide = HistoryConfig(half_life=1.0, min_jobs=20, p90_level=0.9)

    def coverage(cfg: HistoryConfig) -> float:
        preds = replay(jobs, cfg)
        pairs = [(p.p90_seconds, j.seconds) for p, j in zip(preds, jobs, strict=True) if p is not None][200:]
        return sum(a <= b for b, a in pairs) / len(pairs)

    raw, fixed = coverage(narrow), coverage(wide)
    assert raw < 0.85 and abs(fixed - 0.9) < 0.04
