"""One entry point for job forecasts: kind + features + declared duration -> a Prediction (pure).

- a job that has run before (same tenant, name and spec: `own_runs.run_key`): its own
  runs, from the first one on (`own_runs.from_own_runs`);
- training and trial jobs with features: the prior corrected by the learned model;
- quantization jobs with features: the calibrated tiers;
- anything else with a declared duration (batch inference, or a job without features):
  the declared duration times the median actual/declared ratio of completed jobs of
  its kind (all kinds pooled while a kind has fewer than `MIN_DECLARED`), with the
  spread of those ratios. Users' promises are never planned on as they stand once
  there is history.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rota.core.errors import InvalidArgument
from rota.core.forecasting.features import QuantFeatures, TrainingFeatures, parse_quantization, parse_training
from rota.core.forecasting.own_runs import from_own_runs, run_key
from rota.core.forecasting.quantization import DEFAULT_MARGIN, QuantModel, plan_gpu_hours
from rota.core.forecasting.training import (
    COLD_SIGMA,
    Prediction,
    TrainingModel,
    empirical_offsets,
    lognormal_offsets,
)

TRAINING_KINDS = ("training", "trial")
MIN_DECLARED = 8


@dataclass(frozen=True)
class Completion:
    """A finished job as the forecaster learns from it."""

    kind: str
    features: Mapping[str, Any]
    gpus: int
    seconds: float
    declared_seconds: float | None = None
    run_key: str | None = None  # own_runs.run_key of the job, when known


@dataclass(frozen=True)
class JobForecast:
    kind: str
    gpus: int
    prediction: Prediction
    planned_gpu_hours: float | None = None  # quantization: whole GPU-hours with the margin

    def seconds_at(self, q: float) -> float:
        return self.prediction.seconds_at(q)

    def gpu_hours_at(self, q: float) -> float:
        return self.seconds_at(q) * self.gpus / 3600


def _ratios(completions: Sequence[Completion]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for c in completions:
        if c.declared_seconds and c.declared_seconds > 0 and c.seconds > 0:
            ratio = math.log(c.seconds / c.declared_seconds)
            out.setdefault(c.kind, []).append(ratio)
            out.setdefault("", []).append(ratio)
    return out


class Forecaster:
    """Models fit on completed jobs; `skipped` counts completions whose features were invalid."""

    def __init__(self, completions: Sequence[Completion] = (), margin: float = DEFAULT_MARGIN) -> None:
        training: list[tuple[TrainingFeatures, float]] = []
        quant: list[tuple[QuantFeatures, float]] = []
        self.skipped = 0
        self.runs: dict[str, list[float]] = {}
        for c in completions:
            if c.run_key and c.seconds > 0:
                self.runs.setdefault(c.run_key, []).append(c.seconds)
            if not c.features or c.seconds <= 0:
                continue
            try:
                if c.kind in TRAINING_KINDS:
                    training.append((parse_training(c.features, c.gpus), c.seconds))
                elif c.kind == "quantization":
                    quant.append((parse_quantization(c.features, c.gpus), c.seconds))
            except InvalidArgument:
                self.skipped += 1
        self.training = TrainingModel(training)
        self.quantization = QuantModel(quant, margin)
        self.declared_logs = _ratios(completions)
        self.observations = len(completions)

    def from_declared(self, kind: str, declared: float) -> Prediction:
        logs = self.declared_logs.get(kind, [])
        if len(logs) < MIN_DECLARED:
            logs = self.declared_logs.get("", [])
        if len(logs) < MIN_DECLARED:
            return Prediction("declared", declared, lognormal_offsets(COLD_SIGMA), None, len(logs))
        arr = np.array(logs)
        return Prediction("declared-calibrated", declared * math.exp(float(np.median(arr))), empirical_offsets(arr),
                          None, len(logs))

    def predict(self, kind: str, features: Mapping[str, Any], gpus: int, declared: float | None = None,
                key: str | None = None) -> JobForecast:
        """Raises InvalidArgument naming the field when there is nothing to forecast from.

        `key` (own_runs.run_key) names the job across submissions: once it has run, its
        own runs answer, whatever its kind and features."""
        if kind == "realtime":
            raise InvalidArgument("kind", "a realtime app has a demand curve, not a duration (use DemandCurve)")
        if gpus < 1:
            raise InvalidArgument("gpus", f"must be at least 1 (got {gpus})")
        if key and key in self.runs:
            return JobForecast(kind, gpus, from_own_runs(self.runs[key]))
        if features and kind in TRAINING_KINDS:
            return JobForecast(kind, gpus, self.training.predict(parse_training(features, gpus)))
        if features and kind == "quantization":
            f = parse_quantization(features, gpus)
            p = self.quantization.predict(f)
            return JobForecast(kind, gpus, p, plan_gpu_hours(p.p50_seconds, gpus, self.quantization.margin))
        if declared is not None and declared > 0:
            return JobForecast(kind, gpus, self.from_declared(kind, declared))
        needs = "variant, params and tokens" if kind in TRAINING_KINDS else "algorithm and params"
        if kind in (*TRAINING_KINDS, "quantization"):
            raise InvalidArgument("features", f"a {kind} job needs features ({needs}) or a declared duration")
        raise InvalidArgument("duration", f"a {kind} job needs a declared duration to forecast")

    def predict_spec(self, spec: Mapping[str, Any]) -> JobForecast:
        """From a job spec as a mapping (`JobSpecData.to_dict()` or job-file fields)."""
        declared = spec.get("duration_seconds")
        return self.predict(str(spec.get("kind") or "training"), spec.get("features") or {},
                            int(spec.get("gpus") or 1), float(declared) if declared else None,
                            run_key(str(spec.get("tenant") or ""), spec))


def duration_for_plan(spec: Mapping[str, Any], quantile: float = 0.5, forecaster: Forecaster | None = None) -> float | None:
    """Seconds to plan a batch-like job on: its forecast at `quantile` (P50 by default).

    Without a fitted `forecaster` this is the physical prior (or the declared duration).
    Returns None when there is nothing to forecast from (a realtime app, bad features,
    no features and no declared duration): the caller falls back to its own default.
    """
    try:
        return (forecaster or Forecaster()).predict_spec(spec).seconds_at(quantile)
    except InvalidArgument:
        return None
