"""A sequential test for a persistent slowdown in a noisy ratio series (pure; docs/design.md §7).

`FailSlowDetector` (mode "cusum") feeds each rank's ratio (busy time over the cost model's
expectation) here instead of counting k ratios over a threshold in a row. With a per-
iteration noise of σ ≈ 0.13 on the ratio (two contended cores), a 1.2× slowdown is 1.4 σ:
k ratios over 1.1 in a row happen by chance every few hundred iterations, and a 1.2× rank
may wait long for its streak. A CUSUM adds the evidence up instead:

    z_t = clip(log(ratio_t) / σ − κ, −m, m),   S_t = max(0, S_{t−1} + z_t),   κ = log(shift) / (2σ)

and alarms when S_t > h while the median of the last W ratios is past √shift (halfway, in
log terms, to the slowdown it looks for). The clip m = min((c − 1)·κ, h / `persist`) is
symmetric about κ (a Huber-like CUSUM): one iteration adds or takes away at most m. σ is the series' own robust spread (1.4826 ×
MAD of the warm-up's log ratios, times `sigma_scale`); h is set by Siegmund's
approximation of the in-control run length, so that a rank alarms by chance about once
per `ranks × 1000 / false_per_1k` iterations. The clip bounds what one iteration can add,
so an alarm needs at least `persist` iterations of evidence: a transient shorter than that
cannot raise one on its own however slow it is (noise must supply the rest).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from rota.core.errors import InvalidArgument

SIEGMUND_SHIFT = 1.166  # the overshoot correction of Siegmund's approximation (2·0.583)


@dataclass(frozen=True)
class SequentialConfig:
    shift: float = 1.2  # the smallest persistent slowdown to find
    false_per_1k: float = 0.3  # target chance alarms per 1,000 iterations, per job
    window: int = 9  # W: the median of the last W ratios must be past √shift
    clip: float = 3.0  # c: one iteration adds (or takes) at most (c − 1)·κ ...
    persist: int = 8  # ... and at most h / persist: an alarm needs this many iterations of evidence
    sigma_scale: float = 1.0  # σ estimated × this (in-sample spread under-states the noise)
    sigma_floor: float = 0.01  # σ never below this (a near-noiseless series)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.shift) and self.shift > 1):
            raise InvalidArgument("shift", f"must be a ratio above 1 (got {self.shift})")
        if not (math.isfinite(self.false_per_1k) and self.false_per_1k > 0):
            raise InvalidArgument("false_per_1k", f"must be positive (got {self.false_per_1k})")
        if self.window < 1:
            raise InvalidArgument("window", f"must be at least 1 (got {self.window})")
        if not (math.isfinite(self.clip) and self.clip > 1):
            raise InvalidArgument("clip", f"must be above 1 (got {self.clip})")
        if self.persist < 1:
            raise InvalidArgument("persist", f"must be at least 1 (got {self.persist})")
        if not (math.isfinite(self.sigma_scale) and self.sigma_scale > 0):
            raise InvalidArgument("sigma_scale", f"must be positive (got {self.sigma_scale})")
        if not (math.isfinite(self.sigma_floor) and self.sigma_floor > 0):
            raise InvalidArgument("sigma_floor", f"must be positive (got {self.sigma_floor})")


def run_length(kappa: float, h: float) -> float:
    """Siegmund's approximation of a CUSUM's mean run length to a chance alarm, for
    increments N(0, 1) − κ and threshold h (both in units of σ)."""
    b = h + SIEGMUND_SHIFT
    return (math.exp(2 * kappa * b) - 2 * kappa * b - 1) / (2 * kappa * kappa)


def threshold_for(kappa: float, target_run_length: float) -> float:
    """The smallest h whose mean run length to a chance alarm reaches the target (bisection)."""
    if kappa <= 0 or target_run_length <= 1:
        raise InvalidArgument("target_run_length", "needs κ > 0 and a target above 1 iteration")
    lo, hi = 0.0, 1.0
    while run_length(kappa, hi) < target_run_length:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run_length(kappa, mid) < target_run_length else (lo, mid)
    return hi


def robust_sigma(ratios: list[float]) -> float:
    """1.4826 × the median absolute deviation of the log ratios (σ for normal noise)."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return 0.0
    mid = statistics.median(logs)
    return 1.4826 * statistics.median(abs(x - mid) for x in logs)


@dataclass
class Cusum:
    """One series' test. `update(ratio)` is True exactly when an episode opens; the episode
    closes (and the sum restarts) once the window's median has stayed under shift^¼ (half
    the way down again) for W iterations in a row."""

    sigma: float
    h: float
    config: SequentialConfig
    s: float = 0.0
    flagged: bool = False
    calm: int = 0
    recent: deque[float] = field(default_factory=deque)

    @classmethod
    def calibrated(cls, noise: list[float], series: int, config: SequentialConfig) -> Cusum:
        """σ from `noise` (healthy ratios), h for the target chance alarms shared by `series` series."""
        sigma = max(robust_sigma(noise) * config.sigma_scale, config.sigma_floor)
        kappa = math.log(config.shift) / (2 * sigma)
        target = max(series, 1) * 1000 / config.false_per_1k
        return cls(sigma, threshold_for(kappa, target), config)

    @property
    def kappa(self) -> float:
        return math.log(self.config.shift) / (2 * self.sigma)

    @property
    def cap(self) -> float:
        """m: the most one iteration adds to (or takes from) the sum, (c − 1)·κ or h / persist."""
        return min((self.config.clip - 1) * self.kappa, self.h / self.config.persist)

    def update(self, ratio: float) -> bool:
        cfg, kappa, cap = self.config, self.kappa, self.cap
        self.recent.append(ratio)
        while len(self.recent) > cfg.window:
            self.recent.popleft()
        z = math.log(ratio) / self.sigma - kappa if ratio > 0 else -cap
        self.s = max(0.0, self.s + min(max(z, -cap), cap))
        past = statistics.median(self.recent) > math.sqrt(cfg.shift)
        if self.flagged:
            self.calm = 0 if statistics.median(self.recent) > cfg.shift ** 0.25 else self.calm + 1
            if self.calm >= cfg.window:
                self.flagged, self.s, self.calm = False, 0.0, 0
            return False
        if self.s > self.h and past and len(self.recent) >= cfg.window:
            self.flagged = True
            return True
        return False

    def min_iterations(self) -> int:
        """The fewest iterations that can raise an alarm from a zero sum."""
        return math.floor(self.h / self.cap + 1e-9) + 1
