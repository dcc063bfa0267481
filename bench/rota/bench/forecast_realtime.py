"""Realtime scaling on forecasts vs reacting, on the real Helios Earth traffic (May 2020).

Each virtual cluster with demand in at least 90% of its hours is one app; its demand is
the hour's mean running + pending GPUs (real). Every scaler decides once an hour, at
the hour's start, holds whole GPUs and changes at most `MAX_SWAP` GPUs an hour (ours:
one 8-GPU node). What each one reads at the start of hour t:

- reactive (the issue's baseline): scales to the current demand, the last per-minute
  reading of hour t − 1;
- reactive_hour_mean: scales to hour t − 1's mean demand (this benchmark's reactive
  scaler before; kept as a row to show what reading the current minute is worth);
- forecast: the hour's demand forecast from the current reading plus the median of the
  app's own past misses (mean of hour s − last reading before s, over the last
  `RESIDUAL_HOURS` hours: `rota.core.forecasting.conformal.OnlineQuantile` at 0.5;
  median because the two errors cost alike here, not tuned);
- profile: the allocator's realtime model (`rota.core.forecasting.realtime.fit`, every
  hour before as history) re-fit every hour, the next `HORIZON` hours' curve raised
  early ahead of each rise (`to_gpus`), its first step held.

Unmet demand is, per app and hour, ceil(demand) minus the GPUs held when positive
(GPU-steps of one hour); GPU-hours are the GPUs held. Hours without data are skipped.
Weeks: the last week of the trace is judged; the week before is where choices may be
looked at (`tune`); no constant was fitted on either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rota.bench.forecast_traces import Traffic, helios_hourly
from rota.core.forecasting import realtime
from rota.core.forecasting.conformal import OnlineQuantile

MAX_SWAP = 8
DAYS = 7
HORIZON = 6  # hours the profile plan looks ahead (so a rise is met early)
RESIDUAL_HOURS = 168  # the forecast's window of past misses (ours: one week)
MIN_RESIDUALS = 24
ARMS = ("forecast", "reactive", "reactive_hour_mean", "profile")

Target = Callable[[int], float]  # hour index -> GPUs wanted (NaN: nothing seen, hold)


def _plan(y: np.ndarray, first: int, target: Target) -> list[int]:
    held = math.ceil(np.nan_to_num(y[first - 1]))
    plan: list[int] = []
    for t in range(first, first + 24 * DAYS):
        want = target(t)
        if not np.isnan(want):
            held += max(-MAX_SWAP, min(MAX_SWAP, math.ceil(want - 1e-9) - held))
        plan.append(held)
    return plan


def _seen(values: np.ndarray) -> Target:
    """Scale to what was seen at the end of the hour before."""
    return lambda t: float(values[t - 1])


def _nowcast(y: np.ndarray, last: np.ndarray) -> Target:
    def target(t: int) -> float:
        misses = OnlineQuantile(0.5, RESIDUAL_HOURS, MIN_RESIDUALS)
        for s in range(max(1, t - RESIDUAL_HOURS), t):
            if not (np.isnan(y[s]) or np.isnan(last[s - 1])):
                misses.add(float(y[s] - last[s - 1]))
        shift = misses.quantile()
        return float(last[t - 1]) + (shift if shift is not None and math.isfinite(shift) else 0.0)
    return target


def _profile(y: np.ndarray, start_hour: int) -> Target:
    def target(t: int) -> float:
        curve = realtime.fit(y[max(0, t - realtime.HISTORY_HOURS) : t], start_hour + t, HORIZON)
        return float(realtime.to_gpus(curve.values, 1.0, MAX_SWAP)[0])
    return target


def week(traffic: Traffic, apps: list[str], first: int, arms: tuple[str, ...] = ARMS) -> dict[str, dict[str, float]]:
    """{arm: {unmet_gpu_steps, gpu_hours}} over the 7 days from hour index `first`."""
    out = {arm: {"unmet_gpu_steps": 0.0, "gpu_hours": 0.0} for arm in arms}
    for vc in apps:
        y, last = traffic.series[vc], traffic.last[vc]
        targets: dict[str, Target] = {
            "forecast": _nowcast(y, last),
            "reactive": _seen(last),
            "reactive_hour_mean": _seen(y),
            "profile": _profile(y, traffic.start_hour),
        }
        for arm in arms:
            for k, held in enumerate(_plan(y, first, targets[arm])):
                d = y[first + k]
                if np.isnan(d):
                    continue
                out[arm]["unmet_gpu_steps"] += max(0, math.ceil(d - 1e-9) - held)
                out[arm]["gpu_hours"] += held
    return out


def realtime_vs_reactive(src: Path | None = None, min_share: float = 0.9, profile: bool = False
                         ) -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    """(the issue's {forecast, reactive}: {unmet_gpu_steps, gpu_hours} on the judged week,
    {apps, judged: every arm (profile only if asked: it re-fits every hour, about 2 minutes),
    tune: the same but profile on the week before})."""
    traffic = helios_hourly(src)
    apps = [vc for vc, v in sorted(traffic.series.items()) if np.mean(v[~np.isnan(v)] > 0) >= min_share]
    first = 24 * (len(next(iter(traffic.series.values()))) // 24 - DAYS)
    judged = week(traffic, apps, first, ARMS if profile else ARMS[:3])
    tune = week(traffic, apps, first - 24 * DAYS, ARMS[:3])
    return {arm: judged[arm] for arm in ("forecast", "reactive")}, {"apps": len(apps), "judged": judged, "tune": tune}
