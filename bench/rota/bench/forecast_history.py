"""Durations from history on real job logs: the model of `rota.core.forecasting.history` against baselines.

Traces (real, `../shared/data/traces/philly_multigpu_pass.csv`; see its README): the
3,034 passed multi-GPU Philly jobs split by submission month into two logs,
`philly-sep-oct` (Sep 4 to Oct 31 2017) and `philly-nov-dec` (Nov 1 to Dec 21). Real:
submit times, GPU counts, run times (the sum of the attempts) and finish times (the
last attempt's end). Each log is replayed on its own (no history carried over).

Every job is forecast online at its submission, from the jobs of its log that had
finished by then, by
- `model`: the history model (`rota.core.forecasting.history`): the durations of past
  jobs that declared the same limit (once 5 have), else the limit scaled by past limits'
  looseness, else recency, GPU count and time of day; its P50, and its P90 calibrated
  online by a conformal quantile of its own past misses;
- `median`: the running median of every finished job;
- `median_by_gpus`: the running median of finished jobs of the same GPU count (the
  global one while fewer than `MIN_PER_GPUS` have finished);
- `declared`: a time limit as users set them. **Drawn, not real** (Philly logs hold no
  limits): `rota.sim.estimates.declared_limit` (15% the queue's 14-day maximum, else
  the run time over an accuracy uniform in (0.05, 1], rounded up to a round figure).

Jobs with fewer than `HistoryConfig.min_jobs` completions before them are not scored
(no arm is), so every arm is scored on the same jobs.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from rota.core.forecasting.history import HistoryConfig, Past, replay
from rota.core.forecasting.survival import expected_durations
from rota.sim import traces as sim_traces
from rota.sim.estimates import declared_limit

MIN_PER_GPUS = 5
SLICES = (("philly-sep-oct", (9, 10)), ("philly-nov-dec", (11, 12)))


@dataclass(frozen=True)
class LogJob:
    id: str
    submit_s: float
    finish_s: float
    seconds: float
    gpus: int
    hour: float

    def past(self, declared: float | None = None) -> Past:
        return Past(self.submit_s, self.finish_s, self.seconds, self.gpus, self.hour, declared)


def philly_logs(src: Path | None = None) -> dict[str, list[LogJob]]:
    """The Philly multi-GPU jobs by slice, each in submission order, times from its first submission."""
    path = (src or sim_traces.traces_dir()) / "philly_multigpu_pass.csv"
    rows: dict[str, list[tuple[datetime, dict[str, str]]]] = {name: [] for name, _ in SLICES}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            when = datetime.fromisoformat(r["submit_time"])
            name = next((n for n, months in SLICES if when.month in months), None)
            if name is not None:
                rows[name].append((when, r))
    out: dict[str, list[LogJob]] = {}
    for name, items in rows.items():
        items.sort(key=lambda x: float(x[1]["submit_s"]))
        t0 = float(items[0][1]["submit_s"])
        out[name] = [LogJob(r["job_id"], float(r["submit_s"]) - t0, float(r["last_end_s"]) - t0, float(r["run_s"]),
                            int(r["num_gpus"]), when.hour + when.minute / 60) for when, r in items]
    return out


def running_medians(jobs: Sequence[LogJob]) -> tuple[list[float | None], list[float | None]]:
    """(global, per GPU count) running medians of the jobs finished before each submission."""
    by_finish = sorted(range(len(jobs)), key=lambda i: (jobs[i].finish_s, i))
    done: list[float] = []
    per: dict[int, list[float]] = {}
    glob: list[float | None] = []
    gpus: list[float | None] = []
    k = 0
    for j in jobs:
        while k < len(by_finish) and jobs[by_finish[k]].finish_s <= j.submit_s:
            d = jobs[by_finish[k]]
            bisect.insort(done, d.seconds)
            bisect.insort(per.setdefault(d.gpus, []), d.seconds)
            k += 1
        g = float(np.median(done)) if done else None
        own = per.get(j.gpus, [])
        glob.append(g)
        gpus.append(float(np.median(own)) if len(own) >= MIN_PER_GPUS else g)
    return glob, gpus


def _mape(predicted: np.ndarray, actual: np.ndarray) -> float:
    return round(float(np.mean(np.abs(predicted / actual - 1))), 4)


@dataclass(frozen=True)
class Scored:
    """One log's forecasts: per arm the planned seconds of every job (NaN: not scored)."""

    name: str
    jobs: list[LogJob]
    p50: dict[str, np.ndarray]  # arm -> seconds
    p90: np.ndarray  # the model's
    scored: np.ndarray  # bool per job
    expected: np.ndarray  # the model's expected seconds (what sjf orders by; survival.py)


def forecast_log(name: str, jobs: list[LogJob], seed: int, cfg: HistoryConfig | None = None) -> Scored:
    rng = random.Random(f"{name}:{seed}")
    declared = [declared_limit(j.seconds, rng) for j in jobs]
    past = [j.past(d) for j, d in zip(jobs, declared, strict=True)]
    preds = replay(past, cfg)
    glob, gpus = running_medians(jobs)
    scored = np.array([p is not None for p in preds])
    nan = math.nan
    p50 = {
        "model": np.array([p.p50_seconds if p else nan for p in preds]),
        "median": np.array([v if v is not None else nan for v in glob]),
        "median_by_gpus": np.array([v if v is not None else nan for v in gpus]),
        "declared": np.array(declared),
    }
    fallback = [p.p50_seconds if p else d for p, d in zip(preds, declared, strict=True)]
    expected = np.array(expected_durations(past, fallback, (cfg or HistoryConfig()).min_same))
    return Scored(name, jobs, p50, np.array([p.p90_seconds if p else nan for p in preds]), scored, expected)


def accuracy(s: Scored) -> dict[str, object]:
    actual = np.array([j.seconds for j in s.jobs])[s.scored]
    out: dict[str, object] = {
        "name": s.name, "jobs": len(s.jobs), "scored": int(s.scored.sum()),
        "mape": {arm: _mape(v[s.scored], actual) for arm, v in s.p50.items()},
        "median_ratio": {arm: round(float(np.median(v[s.scored] / actual)), 4) for arm, v in s.p50.items()},
        "log_mae": {arm: round(float(np.mean(np.abs(np.log(v[s.scored] / actual)))), 4) for arm, v in s.p50.items()},
        "p90_coverage": round(float(np.mean(actual <= s.p90[s.scored])), 4),
    }
    return out
