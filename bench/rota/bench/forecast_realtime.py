"""Realtime scaling on forecasts vs reacting, on the real Helios Earth traffic (last week of May 2020).

Each virtual cluster with demand in at least 90% of its hours is one app; its demand is
the hour's mean running + pending GPUs (real). Both scalers hold whole GPUs and change
at most `MAX_SWAP` GPUs an hour (ours: one 8-GPU node):

- forecast: every hour the realtime model (`rota.core.forecasting.realtime.fit`, every
  hour before as history) forecasts the next `HORIZON` hours; the GPUs held are its P50
  in GPUs, raised early ahead of each rise (`to_gpus`), as the allocator's realtime plan
  re-made at every step is;
- reactive: each hour, the GPUs held move toward the demand of the hour before (what
  a scaler sees now), by at most the same cap.

Unmet demand is, per app and hour, ceil(demand) minus the GPUs held when positive
(GPU-steps of one hour); GPU-hours are the GPUs held. Hours without data are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rota.bench.forecast_traces import helios_hourly
from rota.core.forecasting import realtime

MAX_SWAP = 8
DAYS = 7
HORIZON = 6  # hours the plan looks ahead (so a rise is met early)


def _forecast_plan(y: np.ndarray, start_hour: int, first: int) -> list[int]:
    """Re-planned every hour, as the allocator re-plans every step: the curve of the next
    HORIZON hours from every hour before, its first step held (within the cap of the last)."""
    held = math.ceil(np.nan_to_num(y[first - 1]))
    plan: list[int] = []
    for t in range(first, first + 24 * DAYS):
        curve = realtime.fit(y[max(0, t - realtime.HISTORY_HOURS) : t], start_hour + t, HORIZON)
        want = realtime.to_gpus(curve.values, 1.0, MAX_SWAP)[0]
        held += max(-MAX_SWAP, min(MAX_SWAP, want - held))
        plan.append(held)
    return plan


def _reactive_plan(y: np.ndarray, first: int) -> list[int]:
    held = math.ceil(np.nan_to_num(y[first - 1]))
    plan: list[int] = []
    for t in range(first, first + 24 * DAYS):
        seen = y[t - 1]
        if not np.isnan(seen):
            held += max(-MAX_SWAP, min(MAX_SWAP, math.ceil(seen - 1e-9) - held))
        plan.append(held)
    return plan


def realtime_vs_reactive(src: Path | None = None, min_share: float = 0.9) -> tuple[dict[str, dict[str, float]], int]:
    """({arm: {unmet_gpu_steps, gpu_hours}}, how many apps)."""
    traffic = helios_hourly(src)
    out = {"forecast": {"unmet_gpu_steps": 0.0, "gpu_hours": 0.0}, "reactive": {"unmet_gpu_steps": 0.0, "gpu_hours": 0.0}}
    apps = [vc for vc, v in sorted(traffic.series.items()) if np.mean(v[~np.isnan(v)] > 0) >= min_share]
    for vc in apps:
        y = traffic.series[vc]
        first = 24 * (len(y) // 24 - DAYS)
        plans = {"forecast": _forecast_plan(y, traffic.start_hour, first), "reactive": _reactive_plan(y, first)}
        for arm, plan in plans.items():
            for k, held in enumerate(plan):
                d = y[first + k]
                if np.isnan(d):
                    continue
                out[arm]["unmet_gpu_steps"] += max(0, math.ceil(d - 1e-9) - held)
                out[arm]["gpu_hours"] += held
    return out, len(apps)
