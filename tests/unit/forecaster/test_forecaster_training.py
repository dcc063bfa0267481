"""The learned correction over the prior: cold start, what it learns, and its interval."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rota.core.forecasting.features import TrainingFeatures, parse_training
from rota.core.forecasting.prior import training_seconds
from rota.core.forecasting.training import (
    COLD_SIGMA,
    MIN_JOBS,
    Prediction,
    TrainingModel,
    empirical_offsets,
    fit_ridge,
    lognormal_offsets,
)


def jobs(n: int, seed: int = 0) -> list[TrainingFeatures]:
    rng = random.Random(seed)
    return [parse_training({"variant": rng.choice(["full-sft", "lora-sft", "full-dpo"]), "params": rng.choice([1e9, 7e9]),
                            "tokens": rng.uniform(1e7, 1e9), "seq_len": rng.choice([1024, 4096]),
                            "gpu_type": rng.choice(["a100-80gb", "h100"])}, rng.choice([1, 2, 4, 8]))
            for _ in range(n)]


def test_a_cold_cluster_answers_with_the_prior_and_a_fixed_log_normal_spread() -> None:
    f = jobs(1)[0]
    p = TrainingModel([(g, 100.0) for g in jobs(MIN_JOBS - 1)]).predict(f)
    assert p.model == "prior" and p.p50_seconds == training_seconds(f) == p.prior_seconds
    # P90 / P50 = exp(1.2816 sigma) for a log-normal.
    assert p.p90_seconds / p.p50_seconds == pytest.approx(math.exp(1.2815516 * COLD_SIGMA), rel=1e-6)
    assert p.p10_seconds * p.p90_seconds == pytest.approx(p.p50_seconds**2)


def test_jobs_that_all_take_twice_the_prior_teach_the_model_to_double_it() -> None:
    history = [(f, 2 * training_seconds(f)) for f in jobs(60)]
    model = TrainingModel(history)
    for f in jobs(10, seed=1):
        p = model.predict(f)
        assert p.model == "learned"
        assert p.p50_seconds / training_seconds(f) == pytest.approx(2.0, rel=0.01)


def test_a_slowdown_on_one_gpu_type_is_learned_for_that_type_only() -> None:
    history = [(f, training_seconds(f) * (1.5 if f.gpu_type == "h100" else 1.0)) for f in jobs(200)]
    model = TrainingModel(history)
    h100 = [f for f in jobs(40, seed=3) if f.gpu_type == "h100"]
    a100 = [f for f in jobs(40, seed=3) if f.gpu_type != "h100"]
    assert np.median([model.predict(f).p50_seconds / training_seconds(f) for f in h100]) == pytest.approx(1.5, rel=0.05)
    assert np.median([model.predict(f).p50_seconds / training_seconds(f) for f in a100]) == pytest.approx(1.0, rel=0.05)


def test_the_interval_is_as_wide_as_the_models_held_out_errors() -> None:
    rng = random.Random(5)
    history = [(f, training_seconds(f) * math.exp(rng.gauss(0, 0.2))) for f in jobs(400)]
    p = TrainingModel(history).predict(jobs(1, seed=9)[0])
    # log(P90 / P50) of N(0, 0.2) noise is 1.28 x 0.2 = 0.256; the leave-one-out residuals estimate it.
    assert math.log(p.p90_seconds / p.p50_seconds) == pytest.approx(0.256, abs=0.04)
    assert p.p10_seconds < p.p50_seconds < p.p90_seconds


def test_ridge_leave_one_out_residuals_equal_refitting_without_each_row() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.normal(scale=0.3, size=30)
    ridge = fit_ridge(x, y, lambdas=(2.0,))
    z = (x - ridge.mean) / ridge.scale
    design = np.hstack([np.ones((30, 1)), z])
    penalty = np.diag([0.0, 2.0, 2.0, 2.0, 2.0])  # the intercept is not penalised
    for i in range(30):
        keep = np.arange(30) != i
        beta = np.linalg.solve(design[keep].T @ design[keep] + penalty, design[keep].T @ y[keep])
        assert ridge.loo_residuals[i] == pytest.approx(y[i] - design[i] @ beta, abs=1e-9)


@pytest.mark.parametrize(("q", "expected"), [(0.5, 100.0), (0.1, 100 * math.exp(-1.0)), (0.9, 100 * math.exp(1.0)),
                                              (0.01, 100 * math.exp(-1.0 - 0.5)), (0.3, 100 * math.exp(-0.5))])
def test_quantiles_interpolate_in_log_space_and_clamp_to_the_5_to_95_range(q: float, expected: float) -> None:
    # offsets: -1.5 at 0.05, -1 at 0.1, linear in q to 0 at 0.5, to +1 at 0.9 and +1.5 at 0.95
    offsets = tuple(float(np.interp(q_, [0.05, 0.1, 0.5, 0.9, 0.95], [-1.5, -1.0, 0.0, 1.0, 1.5]))
                    for q_ in [round(0.05 * i, 2) for i in range(1, 20)])
    assert Prediction("t", 100.0, offsets).seconds_at(q) == pytest.approx(expected)


def test_offsets_are_centred_on_the_median() -> None:
    offsets = empirical_offsets(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert offsets[9] == 0.0  # q = 0.5
    assert lognormal_offsets(1.0)[9] == pytest.approx(0.0)
