"""Quantization tiers: edges, calibration from completed runs, margin and whole GPU-hours."""

from __future__ import annotations

import math

import pytest

from rota.core.forecasting import prior
from rota.core.forecasting.features import QuantFeatures
from rota.core.forecasting.quantization import QuantModel, plan_gpu_hours, tier_of, work_units


def q(algorithm: str = "gptq", billions: float = 7, calib: int = 128, gpu: str = "a100-80gb", gpus: int = 1) -> QuantFeatures:
    return QuantFeatures(algorithm, billions * 1e9, 4, gpu, calib, gpus)


@pytest.mark.parametrize(("billions", "tier"), [(0.5, 0), (1.99, 0), (2, 1), (7, 2), (13, 3), (34, 4), (70, 5), (180, 6),
                                                (405, 7)])
def test_tiers_split_sizes_at_2_5_10_20_40_80_and_200_billion(billions: float, tier: int) -> None:
    assert tier_of(billions * 1e9) == tier


def test_work_is_billions_times_calibration_passes_over_gpu_speed() -> None:
    assert work_units(q(billions=7, calib=256)) == pytest.approx(14.0)
    assert work_units(q("bitsandbytes", billions=7, calib=256)) == pytest.approx(7.0)  # no calibration set
    assert work_units(q(gpu="h100")) == pytest.approx(7 / (989 / 312) ** 0.7)


def test_a_tier_without_runs_answers_with_the_prior() -> None:
    p = QuantModel().predict(q())
    assert p.model == "tiers-prior" and p.p50_seconds == prior.quantization_seconds(q())


def test_runs_of_a_tier_calibrate_its_startup_and_rate() -> None:
    # True cost: 300 s + 200 s per work unit; sizes 5..9.5B all fall in the 5-10B tier.
    runs = [(f, 300 + 200 * work_units(f)) for f in (q(billions=5 + 0.5 * i) for i in range(10))]
    model = QuantModel(runs)
    p = model.predict(q(billions=8))
    assert p.model == "tiers"
    # 3 prior pseudo-runs pull the fit slightly towards the prior; 10 exact runs dominate.
    assert p.p50_seconds == pytest.approx(300 + 200 * 8, rel=0.05)
    assert model.predict(q(billions=70)).model == "tiers-prior"  # another tier is still cold
    assert model.predict(q("awq")).model == "tiers-prior"  # and so is another algorithm


@pytest.mark.parametrize(("p50_s", "gpus", "margin", "hours"), [
    (600, 1, 0.2, 1.0),  # 0.17 GPU-h x 1.2 = 0.2 -> at least one
    (3000, 1, 0.2, 1.0),  # 0.833 x 1.2 = 1.0 exactly
    (3001, 1, 0.2, 2.0),
    (3600, 2, 0.2, 3.0),  # 2 x 1.2 = 2.4 -> 3
    (7200, 4, 0.0, 8.0),
])
def test_the_plan_is_p50_gpu_hours_with_the_margin_rounded_up(p50_s: float, gpus: int, margin: float, hours: float) -> None:
    assert plan_gpu_hours(p50_s, gpus, margin) == hours


def test_a_quantization_forecast_carries_its_rounded_plan_and_an_interval() -> None:
    runs = [(f, (300 + 200 * work_units(f)) * math.exp(0.1 * ((i % 5) - 2))) for i, f in
            enumerate(q(billions=5 + 0.25 * i) for i in range(20))]
    model = QuantModel(runs)
    p = model.predict(q(billions=8))
    assert p.p10_seconds < p.p50_seconds < p.p90_seconds
    assert model.planned_gpu_hours(q(billions=8)) == math.ceil(p.p50_seconds / 3600 * 1.2)
