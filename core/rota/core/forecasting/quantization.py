"""Quantization GPU-hours: calibrated tiers by parameter count per algorithm (pure).

A tier is a range of model sizes. A job costs a fixed startup (its algorithm's) plus
its tier's *rate* times its work: billions of parameters on the reference GPU
(`prior.gpu_speed` scales other GPUs), times the calibration set's size relative to
128 samples for AWQ and GPTQ, whose calibration passes scale with it. A cold tier uses
the prior (`prior.QUANT_SECONDS_PER_B`, `prior.QUANT_STARTUP_S`). Completed runs
calibrate each algorithm's startup and tier rates together by least squares on the
relative error, pulled towards the prior with the weight of `PRIOR_WEIGHT` runs per
value; a tier's spread comes from its own log-residuals once it has `MIN_SPREAD` runs
(the algorithm's pooled ones before). The plan is the P50 GPU-hours plus a safety
margin, rounded up to whole GPU-hours.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rota.core.forecasting import prior
from rota.core.forecasting.features import ALGORITHMS, QuantFeatures
from rota.core.forecasting.training import COLD_SIGMA, Prediction, empirical_offsets, lognormal_offsets

TIER_EDGES_B = (2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 200.0)  # tier i holds sizes below edge i; the last is open
TIERS = len(TIER_EDGES_B) + 1
PRIOR_WEIGHT = 3.0
MIN_SPREAD = 8
DEFAULT_MARGIN = 0.2


def tier_of(params: float) -> int:
    return bisect.bisect_right(TIER_EDGES_B, params / 1e9)


def tier_label(algorithm: str, index: int) -> str:
    low = TIER_EDGES_B[index - 1] if index else 0.0
    high = f"{TIER_EDGES_B[index]:g}B" if index < len(TIER_EDGES_B) else "up"
    return f"{algorithm} {low:g}B-{high}"


def work_units(f: QuantFeatures) -> float:
    """Billions of parameters x calibration passes, on the reference GPU."""
    calib = f.calib_samples / 128 if f.algorithm != "bitsandbytes" else 1.0
    return f.params / 1e9 * calib / prior.gpu_speed(f.gpu_type)


def _prior_rate(f: QuantFeatures) -> float:
    return (prior.quantization_seconds(f) - prior.QUANT_STARTUP_S) / work_units(f)


@dataclass(frozen=True)
class Calibration:
    """One algorithm's startup seconds and rate per tier (seconds per work unit)."""

    startup_s: float
    rates: tuple[float, ...]
    runs: tuple[int, ...]
    offsets: dict[int, tuple[float, ...]]
    pooled: tuple[float, ...]
    bias: float  # median log-residual: least squares on relative error leans low


def calibrate(runs: Sequence[tuple[QuantFeatures, float]]) -> Calibration:
    """Weighted least squares of seconds = startup + rate[tier] x work, on relative error."""
    ref = [_prior_rate(f) for f, _ in runs] or [1.0]
    prior_rates = [float(np.median([r for (f, _), r in zip(runs, ref, strict=False) if tier_of(f.params) == t] or ref))
                   for t in range(TIERS)]
    rows, target = [], []
    for f, seconds in runs:
        row = np.zeros(1 + TIERS)
        row[0], row[1 + tier_of(f.params)] = 1.0, work_units(f)
        rows.append(row / seconds)
        target.append(1.0)
    anchors = [prior.QUANT_STARTUP_S, *prior_rates]
    for i, value in enumerate(anchors):  # shrink each unknown towards the prior
        row = np.zeros(1 + TIERS)
        row[i] = math.sqrt(PRIOR_WEIGHT) / value
        rows.append(row)
        target.append(math.sqrt(PRIOR_WEIGHT))
    solution = np.linalg.lstsq(np.array(rows), np.array(target), rcond=None)[0]
    startup, rates = max(0.0, float(solution[0])), [max(1e-6, float(r)) for r in solution[1:]]
    residuals: dict[int, list[float]] = {}
    for f, seconds in runs:
        t = tier_of(f.params)
        residuals.setdefault(t, []).append(math.log(max(seconds, 1.0) / (startup + rates[t] * work_units(f))))
    every = np.array([r for values in residuals.values() for r in values])
    bias = float(np.median(every)) if len(every) else 0.0
    return Calibration(
        startup, tuple(rates), tuple(len(residuals.get(t, ())) for t in range(TIERS)),
        {t: empirical_offsets(np.array(v)) for t, v in residuals.items() if len(v) >= MIN_SPREAD},
        empirical_offsets(every) if len(every) >= MIN_SPREAD else lognormal_offsets(COLD_SIGMA), bias,
    )


class QuantModel:
    def __init__(self, runs: Sequence[tuple[QuantFeatures, float]] = (), margin: float = DEFAULT_MARGIN) -> None:
        self.margin = margin
        self.n = len(runs)
        by_algorithm: dict[str, list[tuple[QuantFeatures, float]]] = {}
        for f, seconds in runs:
            by_algorithm.setdefault(f.algorithm, []).append((f, seconds))
        self.calibrations = {a: calibrate(r) for a, r in by_algorithm.items()}

    def predict(self, f: QuantFeatures) -> Prediction:
        """Duration on the job's GPUs (quantization runs layer by layer: GPUs add memory, not speed)."""
        prior_s = prior.quantization_seconds(f)
        c = self.calibrations.get(f.algorithm)
        t = tier_of(f.params)
        if c is None or not c.runs[t]:
            offsets = c.pooled if c is not None else lognormal_offsets(COLD_SIGMA)
            return Prediction("tiers-prior", prior_s, offsets, prior_s, self.n)
        seconds = (c.startup_s + c.rates[t] * work_units(f)) * math.exp(c.bias)
        return Prediction("tiers", seconds, c.offsets.get(t, c.pooled), prior_s, self.n)

    def planned_gpu_hours(self, f: QuantFeatures) -> float:
        return plan_gpu_hours(self.predict(f).p50_seconds, f.gpus, self.margin)

    def table(self) -> list[tuple[str, int, float, float]]:
        """(tier, runs, startup s, seconds per billion parameters on the reference GPU) per calibrated tier."""
        return [(tier_label(a, t), c.runs[t], c.startup_s, c.rates[t])
                for a, c in sorted(self.calibrations.items()) for t in range(TIERS) if c.runs[t]]


def plan_gpu_hours(p50_seconds: float, gpus: int, margin: float = DEFAULT_MARGIN) -> float:
    """P50 GPU-hours with the safety margin, rounded up to whole GPU-hours (at least one)."""
    return float(max(1, math.ceil(p50_seconds * gpus / 3600 * (1 + margin) - 1e-9)))


def prior_model() -> QuantModel:
    return QuantModel()


__all__ = ["ALGORITHMS", "QuantModel", "plan_gpu_hours", "prior_model", "tier_of", "work_units"]
