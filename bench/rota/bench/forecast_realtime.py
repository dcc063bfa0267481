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
# The frontier (`frontier`): each arm at several settings, so that the two are compared at
# equal GPU-hours. Forecast: the quantile of the app's past misses it adds; reactive: the
# share of the current demand it holds on top (whole GPUs, rounded down).
FRONTIER_LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
HEADROOM_SHARES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)

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


def _headroom(values: np.ndarray, share: float) -> Target:
    """Scale to what was seen plus `share` of it (rounded down: whole GPUs, a small app gets none)."""
    return lambda t: float(values[t - 1]) + math.floor(share * float(values[t - 1]))


def _nowcast(y: np.ndarray, last: np.ndarray, level: float = 0.5) -> Target:
    def target(t: int) -> float:
        misses = OnlineQuantile(level, RESIDUAL_HOURS, MIN_RESIDUALS)
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


def _targets(traffic: Traffic, vc: str) -> dict[str, Target]:
    y, last = traffic.series[vc], traffic.last[vc]
    out: dict[str, Target] = {
        "forecast": _nowcast(y, last),
        "reactive": _seen(last),
        "reactive_hour_mean": _seen(y),
        "profile": _profile(y, traffic.start_hour),
    }
    for level in FRONTIER_LEVELS:
        out[f"forecast_q{level:g}"] = _nowcast(y, last, level)
    for share in HEADROOM_SHARES:
        out[f"reactive_plus{share:g}"] = _headroom(last, share)
    return out


def week(traffic: Traffic, apps: list[str], first: int, arms: tuple[str, ...] = ARMS) -> dict[str, dict[str, float]]:
    """{arm: {unmet_gpu_steps, gpu_hours}} over the 7 days from hour index `first`."""
    out = {arm: {"unmet_gpu_steps": 0.0, "gpu_hours": 0.0} for arm in arms}
    for vc in apps:
        y = traffic.series[vc]
        targets = _targets(traffic, vc)
        for arm in arms:
            for k, held in enumerate(_plan(y, first, targets[arm])):
                d = y[first + k]
                if np.isnan(d):
                    continue
                out[arm]["unmet_gpu_steps"] += max(0, math.ceil(d - 1e-9) - held)
                out[arm]["gpu_hours"] += held
    return out


def _judged_week(src: Path | None, min_share: float) -> tuple[Traffic, list[str], int]:
    """The Helios traffic, the apps that want GPUs in at least `min_share` of its hours, and
    the hour index of the judged week (the trace's last whole one; the tuning week before it)."""
    traffic = helios_hourly(src)
    apps = [vc for vc, v in sorted(traffic.series.items()) if np.mean(v[~np.isnan(v)] > 0) >= min_share]
    return traffic, apps, 24 * (len(next(iter(traffic.series.values()))) // 24 - DAYS)


def realtime_vs_reactive(src: Path | None = None, min_share: float = 0.9, profile: bool = False
                         ) -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    """(the issue's {forecast, reactive}: {unmet_gpu_steps, gpu_hours} on the judged week,
    {apps, judged: every arm (profile only if asked: it re-fits every hour, about 2 minutes),
    tune: the same but profile on the week before})."""
    traffic, apps, first = _judged_week(src, min_share)
    judged = week(traffic, apps, first, ARMS if profile else ARMS[:3])
    tune = week(traffic, apps, first - 24 * DAYS, ARMS[:3])
    return {arm: judged[arm] for arm in ("forecast", "reactive")}, {"apps": len(apps), "judged": judged, "tune": tune}


Point = tuple[float, float]  # (GPU-hours, unmet GPU-steps)


def unmet_at(points: list[Point], gpu_hours: float) -> float | None:
    """Unmet GPU-steps of the frontier through `points` at `gpu_hours` (linear between the two
    settings around it; None outside their range: no extrapolation). The frontier is the lower
    envelope: a setting that holds more and leaves more unmet than another is left out."""
    pts = sorted(points)
    env = [p for i, p in enumerate(pts) if all(q[1] > p[1] for q in pts[:i])]
    for (h0, u0), (h1, u1) in zip(env, env[1:], strict=False):
        if h0 <= gpu_hours <= h1:
            return u0 if h1 == h0 else u0 + (u1 - u0) * (gpu_hours - h0) / (h1 - h0)
    if env and env[0][0] == gpu_hours:
        return env[0][1]
    return None


def frontier(src: Path | None = None, min_share: float = 0.9) -> dict[str, dict[str, dict[str, float]]]:
    """{week (judged, tune): {arm setting: {unmet_gpu_steps, gpu_hours}}} for every frontier setting."""
    traffic, apps, first = _judged_week(src, min_share)
    arms = tuple(f"forecast_q{q:g}" for q in FRONTIER_LEVELS) + tuple(f"reactive_plus{s:g}" for s in HEADROOM_SHARES)
    return {"judged": week(traffic, apps, first, arms), "tune": week(traffic, apps, first - 24 * DAYS, arms)}


def frontier_lines(weeks: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Each forecast setting beside the reactive frontier at the forecast's GPU-hours."""
    lines = ["realtime frontier (unmet GPU-steps at equal GPU-hours; reactive interpolated between its settings)"]
    for key, arms in weeks.items():
        reactive = [(v["gpu_hours"], v["unmet_gpu_steps"]) for a, v in arms.items() if a.startswith("reactive")]
        lines.append(f"  {key}: reactive + share of demand: " + ", ".join(
            f"{a.removeprefix('reactive_plus')} {v['unmet_gpu_steps']:.0f}/{v['gpu_hours']:.0f}"
            for a, v in arms.items() if a.startswith("reactive")))
        for a, v in arms.items():
            if a.startswith("forecast"):
                r = unmet_at(reactive, v["gpu_hours"])
                lines.append(f"    {a:13} {v['unmet_gpu_steps']:6.0f} unmet {v['gpu_hours']:9.0f} GPU-h   reactive there: "
                             + ("outside its range" if r is None else f"{r:.0f} unmet"))
    return lines


if __name__ == "__main__":
    print("\n".join(frontier_lines(frontier())))
