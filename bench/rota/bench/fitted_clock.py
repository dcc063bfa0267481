"""What an engine step costs on a benchmark's virtual clock: a model fitted to measurements.

``MeasuredClock`` (`rota.jobkit.inference.clock`) charges each step the CPU time of this thread during it
(``time.thread_time``; torch runs in this thread with one intra-op thread). On a machine
shared with other busy processes that time still wanders by ±10% from run to run, more
than the differences a benchmark wants to show; ``FittedClock`` therefore charges a
linear model of the step's work (a fixed cost, tokens, context positions read by decodes,
query x context pairs of prefill chunks), fitted by least squares to the measured cost of
a calibration run's steps (``calibrate``) on this machine. Every arm of a benchmark then
pays the same price for the same work, and a run is deterministic for a seed; the engine
still computes every step for real (recompute is a real prefill, it is only *priced* by the
model).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np

from rota.jobkit.inference.clock import MeasuredClock, work_features
from rota.jobkit.inference.engine import Engine, EngineConfig, Finished
from rota.jobkit.inference.model import ModelConfig

__all__ = ["FEATURES", "CheckedClock", "FittedClock", "calibrate", "fit", "fit_error"]

FEATURES = ("step", "token", "decode_context", "prefill_pair")


@dataclass(frozen=True)
class FittedClock:
    coefficients: tuple[float, ...]  # seconds per unit of each of FEATURES
    r2: float = 0.0

    def cost(self, work: tuple[int, ...]) -> float:
        if not work or work[0] == 0:
            return 0.0
        return max(1e-5, float(np.dot(self.coefficients, (1.0, *work))))

    def step(self, engine: Engine) -> tuple[list[Finished], float]:
        out = engine.step()
        return out, self.cost(work_features(engine.last_work))

    def describe(self) -> dict[str, object]:
        return {"kind": "fitted", "r2": round(self.r2, 4),
                "coefficients_us": {f: round(c * 1e6, 4) for f, c in zip(FEATURES, self.coefficients, strict=True)}}


@dataclass
class CheckedClock:
    """The fitted clock, and each step's measured cost beside what the fit charged for it:
    the fit is made on an ample cache at start-up, and these are the benchmark's own steps
    (evictions, recompute, every batch shape), so its error here is out of sample."""

    fitted: FittedClock
    pairs: list[tuple[float, float]] = field(default_factory=list)  # (charged, measured) seconds

    def step(self, engine: Engine) -> tuple[list[Finished], float]:
        started = time.thread_time()
        out = engine.step()
        measured = time.thread_time() - started
        charged = self.fitted.cost(work_features(engine.last_work))
        if engine.last_work[0]:
            self.pairs.append((charged, measured))
        return out, charged


def fit_error(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """How well charged costs match measured ones: r² of the charged against the measured,
    the median of |charged - measured| / measured per step, and the error of the total."""
    if not pairs:
        return {"steps": 0}
    charged = np.array([c for c, _ in pairs])
    measured = np.array([m for _, m in pairs])
    residual = measured - charged
    spread = float(((measured - measured.mean()) ** 2).sum())
    r2 = 1.0 - float(residual @ residual) / spread if spread > 0 else (1.0 if not residual.any() else 0.0)
    rel = np.abs(residual) / np.maximum(measured, 1e-9)
    return {"steps": len(pairs), "r2": round(r2, 4), "median_rel_error": round(float(np.median(rel)), 4),
            "total_rel_error": round(float(charged.sum() / max(measured.sum(), 1e-12) - 1.0), 4)}


def fit(samples: list[tuple[tuple[int, ...], float]]) -> FittedClock:
    """Least squares with non-negative coefficients (a negative one is dropped and the rest refitted)."""
    x = np.array([(1.0, *w) for w, _ in samples])
    y = np.array([c for _, c in samples])
    keep = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(x.shape[1])
    full[keep] = np.maximum(coef, 0.0)
    residual = y - x @ full
    r2 = 1.0 - float(residual @ residual) / max(float(((y - y.mean()) ** 2).sum()), 1e-12)
    return FittedClock(tuple(float(c) for c in full), r2)


def calibrate(model: ModelConfig, seed: int = 0, token_budget: int = 512, repeats: int = 2) -> FittedClock:
    """Measure steps of batches of several sizes and prompt lengths and fit the model. The
    same steps run ``repeats`` times (the schedule is deterministic) and each step keeps its
    least cost: a step that another process interrupted is measured again."""
    runs: list[list[tuple[tuple[int, ...], float]]] = []
    for _ in range(max(1, repeats)):
        rng = random.Random(seed)
        engine = Engine(EngineConfig(cache_blocks=1024, token_budget=token_budget, model=model))
        clock = MeasuredClock(record=True)
        for batch, length in ((1, 64), (1, 640), (6, 64), (6, 640), (16, 64), (16, 320), (24, 480)):
            for i in range(batch):
                engine.add_request(f"c{batch}-{length}-{i}", [rng.randrange(model.vocab) for _ in range(length)], 24)
            while engine.has_work():
                clock.step(engine)
        runs.append(clock.samples)
    best = [(work, min(run[i][1] for run in runs)) for i, (work, _) in enumerate(runs[0])]
    return fit(best)
