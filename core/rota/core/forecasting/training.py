"""Training-job durations: the physical prior corrected by a model of completed jobs (pure).

The learned part is a ridge regression of log(actual / prior) on the job's features
(log sizes, one-hot variant, GPU type and precision, flags). Its penalty is chosen by
exact leave-one-out error over a small grid, and the leave-one-out residuals give the
interval: P10/P50/P90 are the prior times exp(prediction + residual quantile), so the
interval is as wide as the model's own held-out errors. With too few completed jobs
(a cold cluster) the prior answers alone with a wide, fixed log-normal spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from rota.core.forecasting.features import GPU_TYPES, PRECISIONS, VARIANTS, TrainingFeatures
from rota.core.forecasting.prior import training_seconds

QUANTILES = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
COLD_SIGMA = 0.6  # log-spread of the prior alone: P90 ≈ 2.2 × P50
MIN_JOBS = 20  # completed jobs before the learned correction is used
LAMBDAS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


@dataclass(frozen=True)
class Prediction:
    """A duration forecast: P50 and log-offsets of the other quantiles of QUANTILES."""

    model: str  # prior | learned | tiers-prior | tiers | declared | declared-calibrated
    p50_seconds: float
    log_offsets: tuple[float, ...]  # log(q-quantile / P50) for each of QUANTILES
    prior_seconds: float | None = None
    observations: int = 0

    def seconds_at(self, q: float) -> float:
        """The q-quantile (0 < q < 1), interpolated in log space; clamped to 0.05..0.95."""
        q = min(max(q, QUANTILES[0]), QUANTILES[-1])
        return self.p50_seconds * math.exp(float(np.interp(q, QUANTILES, self.log_offsets)))

    @property
    def p10_seconds(self) -> float:
        return self.seconds_at(0.1)

    @property
    def p90_seconds(self) -> float:
        return self.seconds_at(0.9)


def lognormal_offsets(sigma: float) -> tuple[float, ...]:
    return tuple(sigma * NormalDist().inv_cdf(q) for q in QUANTILES)


def empirical_offsets(residuals: np.ndarray) -> tuple[float, ...]:
    """Quantiles of residuals around their median."""
    qs = np.quantile(residuals, QUANTILES)
    return tuple(float(v) for v in qs - np.median(residuals))


def design(f: TrainingFeatures, prior_s: float) -> list[float]:
    """The learned model's inputs (before standardisation)."""
    row = [
        math.log(f.params), math.log(f.total_tokens), math.log(f.seq_len), math.log(f.batch_size),
        math.log(f.micro_batch), math.log2(f.gpus), max(0.0, math.log2(f.gpus) - 3),
        math.log(f.lora_rank) if f.method == "lora" else 0.0, float(f.quant_bits < 16),
        float(f.grad_checkpointing), float(f.zero_stage), math.log2(f.tensor_parallel),
        math.log2(f.pipeline_parallel), float(f.flash_attention), float(f.packing), f.rollout_fraction,
        f.reward_params / f.params, f.eval_fraction, math.log1p(f.steps / f.checkpoint_interval)
        if f.checkpoint_interval else 0.0, math.log(prior_s),
    ]
    row += [float(f.variant == v) for v in VARIANTS]
    row += [float(f.gpu_type == g) for g in GPU_TYPES]
    row += [float(f.precision == p) for p in PRECISIONS]
    return row


@dataclass(frozen=True)
class Ridge:
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    lam: float
    loo_residuals: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(((x - self.mean) / self.scale) @ self.coef + self.intercept)


def fit_ridge(x: np.ndarray, y: np.ndarray, lambdas: Sequence[float] = LAMBDAS) -> Ridge:
    """Ridge on standardised columns, penalty by exact leave-one-out error."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    zc, yc = z - z.mean(axis=0), y - y.mean()
    u, s, vt = np.linalg.svd(zc, full_matrices=False)
    best: Ridge | None = None
    best_err = math.inf
    for lam in lambdas:
        shrink = s / (s**2 + lam)
        coef = vt.T @ (shrink * (u.T @ yc))
        # Hat matrix diagonal of the centred ridge fit, plus 1/n for the intercept.
        hat = (u**2) @ (s**2 / (s**2 + lam)) + 1 / len(y)
        loo = (yc - zc @ coef) / (1 - hat)
        err = float(np.mean(np.abs(loo)))
        if err < best_err:
            best_err = err
            best = Ridge(mean, scale, coef, float(y.mean() - (z.mean(axis=0) @ coef)), lam, loo)
    assert best is not None
    return best


class TrainingModel:
    """Fit on completed jobs (features, seconds); predicts any training job."""

    def __init__(self, jobs: Sequence[tuple[TrainingFeatures, float]] = ()) -> None:
        self.n = len(jobs)
        self.ridge: Ridge | None = None
        self.bias = 0.0  # median LOO residual: the correction aims at the median, not the mean
        self.offsets = lognormal_offsets(COLD_SIGMA)
        if self.n >= MIN_JOBS:
            priors = [training_seconds(f) for f, _ in jobs]
            x = np.array([design(f, p) for (f, _), p in zip(jobs, priors, strict=True)])
            y = np.log([max(s, 1.0) / p for (_, s), p in zip(jobs, priors, strict=True)])
            self.ridge = fit_ridge(x, y)
            self.bias = float(np.median(self.ridge.loo_residuals))
            self.offsets = empirical_offsets(self.ridge.loo_residuals)

    def predict(self, f: TrainingFeatures) -> Prediction:
        prior = training_seconds(f)
        if self.ridge is None:
            return Prediction("prior", prior, self.offsets, prior, self.n)
        correction = float(self.ridge.predict(np.array([design(f, prior)]))[0]) + self.bias
        return Prediction("learned", prior * math.exp(correction), self.offsets, prior, self.n)


def prior_only(f: TrainingFeatures) -> Prediction:
    prior = training_seconds(f)
    return Prediction("prior", prior, lognormal_offsets(COLD_SIGMA), prior, 0)
