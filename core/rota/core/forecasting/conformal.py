"""Online conformal quantiles: a forecast's interval calibrated by its own past errors (pure).

Split conformal prediction, made online (Vovk, Gammerman & Shafer, *Algorithmic Learning
in a Random World*, 2005; one-sided, on the scores of conformalized quantile regression,
Romano, Patterson & Candès, NeurIPS 2019): each scored forecast leaves a score
`s = log(actual) − log(forecast bound)` once its actual is known; the next bound is the
raw bound × exp(the ⌈(n + 1)·level⌉-th smallest of the last `window` scores). If scores
are exchangeable, the actual falls at or below the corrected bound with probability at
least `level`; on drifting logs the window keeps it near. `window` and `min_scores` are
ours.
"""

from __future__ import annotations

import math
from collections import deque


class OnlineQuantile:
    """The finite-sample conformal `level`-quantile of the last `window` scores."""

    def __init__(self, level: float, window: int = 500, min_scores: int = 20) -> None:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level: must be in (0, 1) (got {level})")
        if window < 1 or min_scores < 1:
            raise ValueError(f"window, min_scores: must be at least 1 (got {window}, {min_scores})")
        self.level = level
        self.min_scores = min_scores
        self._scores: deque[float] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._scores)

    def add(self, score: float) -> None:
        if not math.isfinite(score):
            raise ValueError(f"score: must be finite (got {score})")
        self._scores.append(score)

    def quantile(self) -> float | None:
        """The correction to add (None while fewer than `min_scores`; +inf when n is too small for the level)."""
        n = len(self._scores)
        if n < self.min_scores:
            return None
        rank = math.ceil((n + 1) * self.level)
        if rank > n:
            return math.inf
        return sorted(self._scores)[rank - 1]
