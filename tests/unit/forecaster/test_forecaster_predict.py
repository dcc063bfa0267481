"""Which model answers which job, and what the allocator gets from `duration_for_plan`."""

from __future__ import annotations

from typing import Any

import pytest

from rota.core.errors import InvalidArgument
from rota.core.forecasting.features import parse_training
from rota.core.forecasting.predict import MIN_DECLARED, Completion, Forecaster, duration_for_plan
from rota.core.forecasting.prior import training_seconds

TRAIN: dict[str, Any] = {"variant": "lora-sft", "params": 1.3e9, "tokens": 2e8}
QUANT: dict[str, Any] = {"algorithm": "awq", "params": 7e9}


@pytest.mark.parametrize(("kind", "features", "declared", "model"), [
    ("training", TRAIN, None, "prior"),
    ("trial", TRAIN, 600.0, "prior"),  # features win over a declared duration
    ("quantization", QUANT, None, "tiers-prior"),
    ("batch_inference", {}, 3600.0, "declared"),
    ("training", {}, 3600.0, "declared"),
])
def test_each_kind_is_answered_by_its_model(kind: str, features: dict[str, Any], declared: float | None, model: str) -> None:
    assert Forecaster().predict(kind, features, 2, declared).prediction.model == model


@pytest.mark.parametrize(("kind", "features", "declared", "field"), [
    ("realtime", {}, None, "kind"),
    ("training", {}, None, "features"),
    ("quantization", {}, None, "features"),
    ("batch_inference", {}, None, "duration"),
    ("training", {"variant": "full-sft"}, None, "features.params"),
])
def test_a_job_with_nothing_to_forecast_from_names_the_missing_field(kind: str, features: dict[str, Any],
                                                                    declared: float | None, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        Forecaster().predict(kind, features, 1, declared)
    assert err.value.field == field


def test_declared_durations_are_corrected_by_the_median_overrun_of_completed_jobs() -> None:
    history = [Completion("batch_inference", {}, 1, 1.5 * d, d) for d in (600.0 * (i + 1) for i in range(MIN_DECLARED))]
    p = Forecaster(history).predict("batch_inference", {}, 1, 1000.0).prediction
    assert p.model == "declared-calibrated"
    assert p.p50_seconds == pytest.approx(1500.0)


def test_completions_with_invalid_features_are_skipped_and_counted() -> None:
    f = Forecaster([Completion("training", {"variant": "nope"}, 1, 100.0), Completion("training", TRAIN, 1, 100.0)])
    assert f.skipped == 1 and f.observations == 2


def test_gpu_hours_are_the_duration_times_the_gpus() -> None:
    fc = Forecaster().predict("training", TRAIN, 4)
    assert fc.gpu_hours_at(0.9) == pytest.approx(fc.seconds_at(0.9) * 4 / 3600)
    assert Forecaster().predict("quantization", QUANT, 1).planned_gpu_hours == 1.0


@pytest.mark.parametrize(("spec", "expected"), [
    ({"kind": "training", "gpus": 2, "features": TRAIN}, training_seconds(parse_training(TRAIN, 2))),
    ({"kind": "batch_inference", "gpus": 1, "duration_seconds": 900.0}, 900.0),
    ({"kind": "realtime", "gpus": 1, "demand": [1, 2]}, None),
    ({"kind": "training", "gpus": 1, "features": {"variant": "bad"}}, None),
    ({"kind": "trial", "gpus": 1}, None),
])
def test_duration_for_plan_is_the_p50_or_none_when_there_is_nothing_to_go_on(spec: dict[str, Any],
                                                                            expected: float | None) -> None:
    got = duration_for_plan(spec)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_duration_for_plan_at_p90_is_longer_than_at_p50() -> None:
    spec = {"kind": "training", "gpus": 1, "features": TRAIN}
    assert duration_for_plan(spec, 0.9) > duration_for_plan(spec, 0.5)  # type: ignore[operator]
