"""What the planner knows of each job's duration: `rota sim --durations oracle|forecast|declared|none`.

- oracle:   the true duration (what `rota sim` always planned on before);
- forecast: the history model's expected duration (rota.core.forecasting.survival: the
  Kaplan–Meier mean of the jobs that declared the same limit, those still running
  censored at their age; else its P50, rota.core.forecasting.history), given the job's
  declared limit as users set them (below), from the jobs of the trace submitted before
  it, a job counting as finished at submit + duration (the trace holds no real finish
  times; queueing would only delay them, so this is the most the model could know); the
  declared limit while fewer than `HistoryConfig.min_jobs` have finished;
- declared: a time limit as users set them, drawn from the true duration (below);
- none:     unknown: a job holds its GPUs until it ends, as far as the plan knows.

Declared limits are drawn, not real (no public trace here holds them): with probability
`AT_MAX` the queue's maximum (14 days), else the run time over an accuracy drawn
uniformly from (ACCURACY_LOW, 1], rounded up to the next round figure of `LIMITS`. The
shape is Mu'alem & Feitelson's (IEEE TPDS 12(6), 2001: accuracy actual/requested roughly
uniform) and Tsafrir, Etsion & Feitelson's (JSSPP 2005: a few round values, a mode at
the maximum); the constants are ours.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import replace

from rota.core.forecasting.history import HistoryConfig, Past, replay
from rota.core.forecasting.survival import expected_durations
from rota.sim.workload import Job

DURATIONS = ("oracle", "forecast", "declared", "none")
HOUR, DAY = 3600.0, 86400.0
LIMITS = (HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 12 * HOUR, DAY, 2 * DAY, 3 * DAY, 7 * DAY, 14 * DAY, 30 * DAY, 60 * DAY)
MAX_LIMIT = 14 * DAY
AT_MAX, ACCURACY_LOW = 0.15, 0.05


def declared_limit(seconds: float, rng: random.Random) -> float:
    """A drawn user time limit for a job that ran `seconds` (never below it: the job passed)."""
    at_max = rng.random() < AT_MAX
    guess = max(seconds, MAX_LIMIT) if at_max else seconds / rng.uniform(ACCURACY_LOW, 1.0)
    i = bisect.bisect_left(LIMITS, guess)
    return LIMITS[i] if i < len(LIMITS) else math.ceil(guess / DAY) * DAY


def declared_limits(jobs: Sequence[Job], seed: int) -> list[float]:
    rng = random.Random(f"declared:{seed}")
    return [declared_limit(j.duration_s, rng) for j in jobs]


def forecasts(jobs: Sequence[Job], declared: Sequence[float], cfg: HistoryConfig | None = None) -> list[float]:
    past = [Past(j.submit_s, j.submit_s + j.duration_s, j.duration_s, j.gpus, (j.submit_s / HOUR) % 24, d)
            for j, d in zip(jobs, declared, strict=True)]
    p50 = [p.p50_seconds if p is not None else d for p, d in zip(replay(past, cfg), declared, strict=True)]
    return expected_durations(past, p50, (cfg or HistoryConfig()).min_same)


def with_durations(jobs: Sequence[Job], mode: str, seed: int = 0) -> list[Job]:
    """The jobs with `planned_s` set as the planner would know them under `mode`."""
    if mode not in DURATIONS:
        raise ValueError(f"--durations: must be one of {', '.join(DURATIONS)} (got {mode!r})")
    if mode == "oracle":
        return list(jobs)
    if mode == "none":
        return [replace(j, planned_s=math.inf) for j in jobs]
    declared = declared_limits(jobs, seed)
    planned = declared if mode == "declared" else forecasts(jobs, declared)
    return [replace(j, planned_s=p) for j, p in zip(jobs, planned, strict=True)]
