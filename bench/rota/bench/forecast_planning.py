"""Planning on forecasts: each Philly log replayed by `rota sim`'s engine with the durations
the planner would know (oracle; the history model's expected duration, its P50 or its
P90; drawn declared limits; none). The issue's JSON reports the expected-duration arm
(`rota.core.forecasting.survival`: what sjf should order by) as `forecast`; the P50 and
P90 arms are text rows.

Jobs keep their real submit times, GPU counts (rounded up to a power of two, as the
buddy allocator places them) and run times; one tenant (the log has no users). The
cluster size `GPUS` is ours: about the GPUs the log keeps busy on average, so queues
form but do not grow without end.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from rota.bench.forecast_history import Scored
from rota.core.fairness.ltgf import FairnessConfig
from rota.sim.engine import SimConfig, Simulator
from rota.sim.orderings import POLICIES
from rota.sim.workload import Job

GPUS = 320
ARMS = ("oracle", "forecast", "forecast_p50", "forecast_p90", "declared", "none")
JSON_ARMS = ("oracle", "forecast", "declared", "none")
PLANNING_POLICIES = ("sjf", "easy")  # the JSON reports the first


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def planned(s: Scored, arm: str) -> list[float]:
    if arm == "oracle":
        return [j.seconds for j in s.jobs]
    if arm == "none":
        return [math.inf] * len(s.jobs)
    declared = s.p50["declared"]
    if arm == "declared":
        return [float(v) for v in declared]
    if arm == "forecast":
        return [float(v) for v in s.expected]
    model = s.p90 if arm == "forecast_p90" else s.p50["model"]
    return [float(m) if np.isfinite(m) else float(d) for m, d in zip(model, declared, strict=True)]


@dataclass(frozen=True)
class PlanFigures:
    avg_jct_s: float
    avg_queue_s: float
    utilization: float


def simulate(s: Scored, arm: str, policy: str, gpus: int = GPUS) -> PlanFigures:
    return simulate_planned(s, planned(s, arm), policy, gpus)


def simulate_planned(s: Scored, plan: Iterable[float], policy: str, gpus: int = GPUS) -> PlanFigures:
    """`s`'s jobs replayed with `plan` as the planner's durations (they run their true ones)."""
    jobs = [Job(j.id, "philly", j.submit_s, j.seconds, min(_pow2(j.gpus), gpus), planned_s=float(p))
            for j, p in zip(s.jobs, plan, strict=True)]
    cfg = SimConfig(gpus, 8, FairnessConfig())
    runs = Simulator(jobs, {"philly": 1.0}, cfg, POLICIES[policy]()).run()
    span = max(r.end_s for r in runs) - min(r.job.submit_s for r in runs)
    return PlanFigures(
        avg_jct_s=statistics.fmean(r.end_s - r.job.submit_s for r in runs),
        avg_queue_s=statistics.fmean(r.intervals[0][0] - r.job.submit_s for r in runs),
        utilization=sum(r.gpus * r.held_s for r in runs) / (gpus * span),
    )


def planning(s: Scored, gpus: int = GPUS) -> dict[str, dict[str, PlanFigures]]:
    """policy -> arm -> figures."""
    return {p: {arm: simulate(s, arm, p, gpus) for arm in ARMS} for p in PLANNING_POLICIES}


def recovered(f: dict[str, PlanFigures], arm: str = "forecast") -> float | None:
    """Share of the declared -> oracle average-JCT gap the `arm` closes (None: no gap)."""
    gap = f["declared"].avg_jct_s - f["oracle"].avg_jct_s
    return None if abs(gap) < 1e-9 else (f["declared"].avg_jct_s - f[arm].avg_jct_s) / gap
