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

Limits are round figures (Tsafrir, Etsion & Feitelson, JSSPP 2005), so many past jobs
declared exactly what this one declares: once `min_same` have, the forecast is the plain
distribution of their durations (the limit's own conditional, which keeps the limits'
order), the weighted one above otherwise. Finally the P90 is calibrated online by the
model's own misses (`rota.core.forecasting.conformal`): each completion that carries the
raw P90 it was forecast leaves a score, and the upper quantiles shift by the conformal
90% quantile of those scores.

The constants are ours, set on the first half of the Philly multi-GPU trace
(September and October 2017) and left as they are for the second half.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from rota.core.forecasting.conformal import OnlineQuantile
from rota.core.forecasting.training import QUANTILES, Prediction


@dataclass(frozen=True)
class HistoryConfig:
    half_life: float = 300.0  # completions
    other_gpus: float = 0.3
    hour_weight: float = 0.5
    min_jobs: int = 20
    bandwidth: float = 0.5  # log-seconds, of the declared/actual density
    min_declared: int = 20  # completions with a declared duration before it counts
    min_same: int = 5  # completions that declared the same limit before they alone are used
    p90_level: float = 0.9  # conformal calibration of the P90 (0: none)
    p90_window: int = 500  # scores


@dataclass(frozen=True)
class Finished:
    """A completion as this model reads it; completions come in the order they finished."""

    seconds: float
    gpus: int
    hour: float  # hour of the day it was submitted, 0 <= hour < 24
    declared: float | None = None  # its declared duration (time limit), if any
    p90: float | None = None  # the raw (uncalibrated) P90 it was forecast at submission, if any


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
        self._same: dict[float, list[float]] = {}  # declared limit -> log durations
        level = self.cfg.p90_level
        self._p90 = OnlineQuantile(level, self.cfg.p90_window) if level > 0 else None

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
            self._same.setdefault(job.declared, []).append(math.log(job.seconds))
        if self._p90 is not None and job.p90 is not None and job.p90 > 0:
            self._p90.add(math.log(job.seconds / job.p90))

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

    def predict_raw(self, gpus: int, hour: float, declared: float | None = None) -> Prediction | None:
        """The forecast before the P90's calibration."""
        if len(self._logs) < self.cfg.min_jobs:
            return None
        same = self._same.get(declared, []) if declared is not None else []
        if len(same) >= self.cfg.min_same:
            qs = np.quantile(np.asarray(same), QUANTILES)
        elif declared is not None and declared > 0 and len(self._ratios) >= self.cfg.min_declared:
            qs = math.log(declared) - np.quantile(np.asarray(self._ratios), QUANTILES[::-1])
        else:
            w = self.weights(gpus, hour)
            like = self.likelihood(declared) if declared is not None and declared > 0 else None
            if like is not None and float((w * like).sum()) > 0:
                w = w * like
            qs = weighted_quantiles(np.asarray(self._logs), w, QUANTILES)
        mid = QUANTILES.index(0.5)
        offsets = tuple(float(q - qs[mid]) for q in qs)
        return Prediction("history", math.exp(float(qs[mid])), offsets, None, len(self._logs))

    def predict(self, gpus: int, hour: float, declared: float | None = None) -> Prediction | None:
        return self.calibrate(self.predict_raw(gpus, hour, declared))

    def calibrate(self, raw: Prediction | None) -> Prediction | None:
        shift = self._p90.quantile() if self._p90 is not None else None
        return raw if raw is None or shift is None else calibrated(raw, shift)


def calibrated(p: Prediction, shift: float) -> Prediction:
    """`p` with its P90 moved by `shift` (log): the quantiles above P50 by a share rising to
    1 at P90, the order of the quantiles kept (a P90 never below the P50)."""
    shift = min(shift, 20.0)  # an unbounded correction (too few scores for the level) caps at e^20
    offsets = np.asarray(p.log_offsets)
    q = np.asarray(QUANTILES)
    moved = offsets + shift * np.clip((q - 0.5) / 0.4, 0.0, None)
    upper = q >= 0.5
    moved[upper] = np.maximum.accumulate(np.maximum(moved[upper], 0.0))
    return Prediction(p.model, p.p50_seconds, tuple(float(v) for v in moved), p.prior_seconds, p.observations)


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
    raw_p90: list[float | None] = [None] * len(items)
    k = 0
    for i in sorted(range(len(items)), key=lambda i: (items[i].submit_s, i)):
        while k < len(by_finish) and items[by_finish[k]].finish_s <= items[i].submit_s:
            done = items[by_finish[k]]
            history.add(Finished(done.seconds, done.gpus, done.hour, done.declared, raw_p90[by_finish[k]]))
            k += 1
        raw = history.predict_raw(items[i].gpus, items[i].hour, items[i].declared)
        raw_p90[i] = raw.p90_seconds if raw is not None else None
        out[i] = history.calibrate(raw)
    return out
