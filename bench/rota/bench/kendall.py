"""Kendall's rank correlation (tau-b, which accounts for ties), in pure Python.

O(n^2) on purpose: the fidelity measurement ranks a few dozen configurations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["kendall_tau"]


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two paired samples; 1.0 when they rank alike, -1.0 when reversed.

    Raises ValueError when the samples differ in length, hold fewer than two pairs, hold a
    non-finite value, or when one of them is constant (tau is undefined).
    """
    if len(x) != len(y):
        raise ValueError(f"y: length {len(y)} differs from x's {len(x)}")
    if len(x) < 2:
        raise ValueError(f"x: tau needs at least 2 pairs, got {len(x)}")
    for name, sample in (("x", x), ("y", y)):
        for i, v in enumerate(sample):
            if not math.isfinite(v):
                raise ValueError(f"{name}[{i}]: {v!r} is not finite")
    concordant, discordant, ties_x, ties_y = _pair_counts(x, y)
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    if denom == 0:
        raise ValueError("x: a constant sample has no ranking; tau is undefined")
    return (concordant - discordant) / denom


def _pair_counts(x: Sequence[float], y: Sequence[float]) -> tuple[int, int, int, int]:
    """(concordant, discordant, tied in x only, tied in y only) over all pairs."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx = x[i] - x[j]
            dy = y[i] - y[j]
            if dx == 0 and dy == 0:
                continue  # tied in both: counts in neither denominator term
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    return concordant, discordant, ties_x, ties_y
