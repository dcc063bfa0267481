"""The micro-batch cost model α·tokens + β·Σ lᵢ², one per pipeline stage, fitted by least squares (pure).

`tokens` pays for the per-token work (projections, MLP), Σ lᵢ² for attention, which grows
with the square of each packed sequence's length. A rank's busy time in an iteration is
the sum over its replica's micro-batches, so it is linear in (α, β) with features
(Σ tokens, Σ Σ lᵢ²): every report gives one equation per rank, and the ranks of one stage
(its tensor-parallel peers, and the same stage in every replica) share one model.

The normal equations are kept with exponential forgetting, so the fit follows slow drift
(a warmer room, a new library version) while a sudden slowdown stands out against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rota.core.detection.layout import MicroBatch

# Features are scaled so the 2x2 system stays well conditioned at realistic sizes.
TOKEN_UNIT = 1e4
SQUARE_UNIT = 1e8
RIDGE = 1e-9


def features(mb: MicroBatch) -> tuple[float, float]:
    """(tokens, Σ lᵢ²) of one micro-batch, in model units."""
    return sum(mb) / TOKEN_UNIT, sum(n * n for n in mb) / SQUARE_UNIT


def replica_features(micro_batches: Iterable[MicroBatch]) -> tuple[float, float]:
    t = q = 0.0
    for mb in micro_batches:
        a, b = features(mb)
        t += a
        q += b
    return t, q


@dataclass
class StageFit:
    """Least squares of y ≈ α·x₁ + β·x₂ through decayed sufficient statistics."""

    decay: float = 1.0
    sxx: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # Σx₁², Σx₁x₂, Σx₂²
    sxy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    n: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0

    def add(self, x: tuple[float, float], y: float) -> None:
        d = self.decay
        a, b = x
        self.sxx = [d * self.sxx[0] + a * a, d * self.sxx[1] + a * b, d * self.sxx[2] + b * b]
        self.sxy = [d * self.sxy[0] + a * y, d * self.sxy[1] + b * y]
        self.n = d * self.n + 1

    def solve(self) -> bool:
        """Refits α and β; False when the data cannot tell them apart yet."""
        a11, a12, a22 = self.sxx
        a11, a22 = a11 * (1 + RIDGE), a22 * (1 + RIDGE)
        det = a11 * a22 - a12 * a12
        if self.n < 2 or det <= 1e-12 * max(a11 * a22, 1e-300):
            # Every micro-batch had the same shape so far: fall back to a time per token.
            if a11 > 0:
                self.alpha, self.beta = self.sxy[0] / a11, 0.0
                return True
            return False
        self.alpha = (a22 * self.sxy[0] - a12 * self.sxy[1]) / det
        self.beta = (a11 * self.sxy[1] - a12 * self.sxy[0]) / det
        if self.beta < 0 or self.alpha < 0:  # noise can tip one below zero: refit on one feature
            self.alpha, self.beta = (max(0.0, self.sxy[0] / a11), 0.0) if self.beta < 0 else (0.0, max(0.0, self.sxy[1] / a22))
        return True

    def predict(self, x: tuple[float, float]) -> float:
        return self.alpha * x[0] + self.beta * x[1]


def fit(samples: Sequence[tuple[tuple[float, float], float]], decay: float = 1.0) -> StageFit:
    f = StageFit(decay=decay)
    for x, y in samples:
        f.add(x, y)
    f.solve()
    return f
