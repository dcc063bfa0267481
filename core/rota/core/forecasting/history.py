"""Durations from history: a job forecast from the jobs that finished before it was submitted (pure).

For a cluster (or a trace) with no job features, or beside them: the forecast is the
distribution of recent completions' durations, each completion weighted by

- recency: halving every `half_life` completions (newer work looks more like the
  next job: Philly's users submit in bursts of similar jobs);
- GPU count: `other_gpus` for a completion of another size (1 for the same);
- time of day: `1 - hour_weight · (1 - cos Δ)/2` by the hours between their submissions
  (jobs submitted at night run longer in Philly: unattended sweeps and long trainings).

P50, P90 and the other QUANTILES are weighted quantiles of the log durations, so the
interval is as wide as what recently finished.

Where the job declares a duration (a time limit), the declaration is evidence too, but
users' limits are loose (often several times the run, sometimes the queue's maximum):
how loose is learned from the completions that declared one. Their log ratios
declared/actual give a density (a histogram smoothed by a Gaussian of `bandwidth`), and
each past completion's weight is multiplied by how likely a job of its duration was to
declare what this one declares: a Bayesian update of the history by the limit, with the
limit's looseness measured rather than assumed. Below `min_jobs` completions there is no
forecast (None): the caller uses its prior or the declared duration.

The constants are ours, set on the first half of the Philly multi-GPU trace
(September and October 2017) and left as they are for the second half.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from rota.core.forecasting.training import QUANTILES, Prediction


@dataclass(frozen=True)
class HistoryConfig:
    half_life: float = 300.0  # completions
    other_gpus: float = 0.3
    hour_weight: float = 0.5
    min_jobs: int = 20
    bandwidth: float = 0.5  # log-seconds, of the declared/actual density
    min_declared: int = 20  # completions with a declared duration before it counts


@dataclass(frozen=True)
class Finished:
    """A completion as this model reads it; completions come in the order they finished."""

    seconds: float
    gpus: int
    hour: float  # hour of the day it was submitted, 0 <= hour < 24
    declared: float | None = None  # its declared duration (time limit), if any


RATIO_BINS = np.linspace(-2.0, 12.0, 141)  # log(declared / actual), 0.1 wide


def ratio_density(ratios: np.ndarray, bandwidth: float) -> np.ndarray:
    """Density of log(declared/actual) at the centres of RATIO_BINS (a smoothed histogram)."""
    counts, _ = np.histogram(np.clip(ratios, RATIO_BINS[0], RATIO_BINS[-1]), RATIO_BINS)
    width = RATIO_BINS[1] - RATIO_BINS[0]
    offsets = np.arange(-4 * bandwidth, 4 * bandwidth + width / 2, width)
    kernel = np.exp(-0.5 * (offsets / bandwidth) ** 2)
    smooth = np.convolve(counts.astype(float), kernel / kernel.sum(), mode="same")
    return smooth / max(smooth.sum() * width, 1e-12)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: Iterable[float]) -> np.ndarray:
    """Quantiles of a weighted sample (the midpoint rule: no value outside the sample)."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(np.asarray(list(qs), float), cum, v)


class DurationHistory:
    """Completions so far, appended as they finish; `predict` reads them all."""

    def __init__(self, cfg: HistoryConfig | None = None) -> None:
        self.cfg = cfg or HistoryConfig()
        self._logs: list[float] = []
        self._gpus: list[int] = []
        self._hours: list[float] = []
        self._ratios: list[float] = []  # log(declared / actual) of those that declared

    def __len__(self) -> int:
        return len(self._logs)

    def add(self, job: Finished) -> None:
        if not job.seconds > 0 or not math.isfinite(job.seconds):
            raise ValueError(f"seconds: must be a positive finite number (got {job.seconds})")
        self._logs.append(math.log(job.seconds))
        self._gpus.append(job.gpus)
        self._hours.append(job.hour % 24)
        if job.declared is not None and job.declared > 0:
            self._ratios.append(math.log(job.declared / job.seconds))

    def weights(self, gpus: int, hour: float) -> np.ndarray:
        c = self.cfg
        n = len(self._logs)
        age = np.arange(n - 1, -1, -1, dtype=float)
        w = 0.5 ** (age / c.half_life)
        w *= np.where(np.asarray(self._gpus) == gpus, 1.0, c.other_gpus)
        delta = 2 * math.pi * (np.asarray(self._hours) - hour % 24) / 24
        return np.asarray(w * (1 - c.hour_weight * (1 - np.cos(delta)) / 2))

    def likelihood(self, declared: float) -> np.ndarray | None:
        """How likely each past completion's duration was to declare `declared` (None: too few declared)."""
        if len(self._ratios) < self.cfg.min_declared:
            return None
        density = ratio_density(np.asarray(self._ratios), self.cfg.bandwidth)
        centres = (RATIO_BINS[:-1] + RATIO_BINS[1:]) / 2
        return np.asarray(np.interp(math.log(declared) - np.asarray(self._logs), centres, density, left=0.0, right=0.0))

    def predict(self, gpus: int, hour: float, declared: float | None = None) -> Prediction | None:
        if len(self._logs) < self.cfg.min_jobs:
            return None
        w = self.weights(gpus, hour)
        like = self.likelihood(declared) if declared is not None and declared > 0 else None
        if like is not None and float((w * like).sum()) > 0:
            w = w * like
        qs = weighted_quantiles(np.asarray(self._logs), w, QUANTILES)
        mid = QUANTILES.index(0.5)
        offsets = tuple(float(q - qs[mid]) for q in qs)
        return Prediction("history", math.exp(float(qs[mid])), offsets, None, len(self._logs))


@dataclass(frozen=True)
class Past:
    """A job of a log, for replaying the history model over it."""

    submit_s: float
    finish_s: float
    seconds: float
    gpus: int
    hour: float  # hour of the day it was submitted
    declared: float | None = None


def replay(jobs: Iterable[Past], cfg: HistoryConfig | None = None) -> list[Prediction | None]:
    """Each job's forecast (in the given order) from the jobs that finished before its submission."""
    items = list(jobs)
    history = DurationHistory(cfg)
    by_finish = sorted(range(len(items)), key=lambda i: (items[i].finish_s, i))
    out: list[Prediction | None] = [None] * len(items)
    k = 0
    for i in sorted(range(len(items)), key=lambda i: (items[i].submit_s, i)):
        while k < len(by_finish) and items[by_finish[k]].finish_s <= items[i].submit_s:
            done = items[by_finish[k]]
            history.add(Finished(done.seconds, done.gpus, done.hour, done.declared))
            k += 1
        out[i] = history.predict(items[i].gpus, items[i].hour, items[i].declared)
    return out
