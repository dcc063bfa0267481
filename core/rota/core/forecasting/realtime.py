"""Realtime demand: a weekly (168-hour) profile per app, recalibrated continuously (pure).

The forecast for hour t is `level × (m + β·(S[t mod 168] − m))`:
- S is the weekly shape: the mean traffic of each hour of the week, each past week
  weighing `WEEK_DECAY` times the one after it (recent weeks weigh more); m its mean.
- level scales the shape to the present: recent traffic over the shape at the same
  hours, each hour's weight halving every `half_life` hours.
- β (how much of the weekly swing to trust) and the half-life are chosen again at every
  fit by walk-forward validation on the app's own last `CALIBRATION_DAYS` days: the
  pair whose day-ahead forecasts had the lowest mean |log error| wins. Those
  validation errors also give the interval (their P10 and P90).
Traffic is requests per hour; GPUs = ceil(traffic / per-replica capacity), raised
ahead of each rise so that no step changes more than the allocator's swap cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

WEEK = 168
WEEK_DECAY = 0.5
BETAS = (0.0, 0.5, 1.0)
HALF_LIVES = (1.0, 3.0, 12.0)
CALIBRATION_DAYS = 7
HISTORY_HOURS = 8 * WEEK
COLD_LOG_SPREAD = 0.5
DEFAULT = (0.5, 3.0)


@dataclass(frozen=True)
class Curve:
    start_hour: int  # unix hour of the first value
    values: tuple[float, ...]  # forecast traffic per hour
    lower: tuple[float, ...]  # P10
    upper: tuple[float, ...]  # P90
    beta: float
    half_life: float


def series(samples: Mapping[int, float], end_hour: int, hours: int = HISTORY_HOURS) -> np.ndarray:
    """Hourly values for [end_hour - hours, end_hour) from {unix hour: value}; NaN = no sample."""
    out = np.full(hours, np.nan)
    for hour, value in samples.items():
        i = hour - (end_hour - hours)
        if 0 <= i < hours:
            out[i] = value
    return out


def weekly_shape(values: np.ndarray, end_hour: int) -> np.ndarray:
    """Mean of each hour of the week (index = unix hour mod 168), recent weeks weighted more."""
    n = len(values)
    hours = np.arange(end_hour - n, end_hour)
    ok = ~np.isnan(values)
    weight = np.where(ok, WEEK_DECAY ** ((end_hour - 1 - hours) / WEEK), 0.0)
    v = np.where(ok, values, 0.0)
    total = np.bincount(hours % WEEK, weight * v, WEEK)
    mass = np.bincount(hours % WEEK, weight, WEEK)
    overall = float((weight * v).sum() / weight.sum()) if weight.sum() > 0 else 0.0
    return np.where(mass > 0, total / np.maximum(mass, 1e-12), overall)


def predict(values: np.ndarray, end_hour: int, horizon: int, beta: float, half_life: float) -> np.ndarray:
    """Traffic for [end_hour, end_hour + horizon) from `values`, the hours before end_hour."""
    shape = weekly_shape(values, end_hour)
    mean = float(shape.mean())
    scaled = mean + beta * (shape - mean)
    recent = values[-WEEK:]
    hours = np.arange(end_hour - len(recent), end_hour)
    ok = ~np.isnan(recent)
    weight = np.where(ok, 0.5 ** ((end_hour - 1 - hours) / half_life), 0.0)
    expected = float((weight * scaled[hours % WEEK]).sum())
    level = float((weight * np.where(ok, recent, 0.0)).sum()) / expected if expected > 0 else 1.0
    ahead = np.arange(end_hour, end_hour + horizon) % WEEK
    return np.maximum(0.0, level * scaled[ahead])


def _validation(values: np.ndarray, end_hour: int, beta: float, half_life: float) -> np.ndarray:
    """log1p errors of day-ahead forecasts made at each of the last CALIBRATION_DAYS midnights' offsets."""
    errors: list[np.ndarray] = []
    for day in range(1, CALIBRATION_DAYS + 1):
        cut = len(values) - 24 * day
        if cut < 24:
            break
        actual = values[cut : cut + 24]
        ok = ~np.isnan(actual)
        if not ok.any() or np.isnan(values[:cut]).all():
            continue
        f = predict(values[:cut], end_hour - 24 * day, 24, beta, half_life)
        errors.append(np.log1p(actual[ok]) - np.log1p(f[ok]))
    return np.concatenate(errors) if errors else np.array([])


def fit(values: np.ndarray, end_hour: int, horizon: int) -> Curve:
    """The calibrated forecast of the `horizon` hours from end_hour."""
    if np.isnan(values).all():
        raise ValueError("no traffic history")
    best: tuple[float, float, float, np.ndarray] | None = None
    for beta in BETAS:
        for half in HALF_LIVES:
            errors = _validation(values, end_hour, beta, half)
            if len(errors) and (best is None or float(np.mean(np.abs(errors))) < best[0]):
                best = (float(np.mean(np.abs(errors))), beta, half, errors)
    beta, half = (best[1], best[2]) if best is not None else DEFAULT
    errors = best[3] if best is not None else np.array([])
    low, high = (np.quantile(errors, [0.1, 0.9]) if len(errors) >= 24 else (-COLD_LOG_SPREAD, COLD_LOG_SPREAD))
    f = predict(values, end_hour, horizon, beta, half)
    lower = np.maximum(0.0, np.expm1(np.log1p(f) + low))
    upper = np.expm1(np.log1p(f) + high)
    return Curve(end_hour, tuple(map(float, f)), tuple(map(float, lower)), tuple(map(float, upper)), beta, half)


def swap_capped(need: Sequence[int], max_swap: int) -> list[int]:
    """GPUs to hold: each step's need, raised early enough that the cap meets every rise
    and falls no faster than the cap (`rota.core.planning.policy_fast.realtime_targets`)."""
    out = list(need)
    for t in range(len(out) - 2, -1, -1):
        out[t] = max(out[t], out[t + 1] - max_swap)
    for t in range(1, len(out)):
        out[t] = max(out[t], out[t - 1] - max_swap)
    return out


def to_gpus(traffic: Sequence[float], capacity: float, max_swap: int) -> list[int]:
    """Replica GPUs that serve `traffic` (requests/hour) at `capacity` requests/hour each."""
    if not capacity > 0:
        raise ValueError("capacity must be positive")
    return swap_capped([math.ceil(v / capacity - 1e-9) for v in traffic], max_swap)
