"""The docs/design.md §3 figures, computed from a scenario and a grid alone.

Nothing here trusts a policy: a reader of the benchmark JSON can recompute every figure
from the grid it prints. Realtime GPUs above demand (FIFO's peak reservation) hold a GPU
but do not count as used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rota.core.planning.grid import Grid, cells_by_job
from rota.core.planning.scenario import Scenario


@dataclass(frozen=True)
class Metrics:
    utilization: float  # used GPU-steps / (G * H)
    value: float  # sum of priority * in-horizon GPU-steps of batch-like jobs
    realtime_unmet: int  # GPU-steps of realtime demand not allocated
    completed: int  # batch-like jobs that finish inside the horizon
    objective: float  # docs/design.md §3 objective: decayed value minus the realtime penalty

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure(s: Scenario, grid: Grid) -> Metrics:
    held = cells_by_job(grid)
    used = 0
    value = 0.0
    decayed = 0.0
    completed = 0
    weights = [s.decay**t for t in range(s.horizon)]
    for j in s.batch:
        steps = held.get(j.id)
        if steps is None:
            continue
        counts = [len(g) for g in steps]
        used += sum(counts)
        value += j.priority * sum(counts)
        decayed += j.priority * sum(w * c for w, c in zip(weights, counts, strict=True))
        start = j.running.started if j.running else next(t for t, c in enumerate(counts) if c)
        completed += start + j.duration <= s.horizon
    unmet = 0
    for r in s.realtime:
        steps = held.get(r.id)
        for t, want in enumerate(r.demand):
            have = len(steps[t]) if steps else 0
            used += min(have, want)
            unmet += max(0, want - have)
    return Metrics(
        utilization=used / (s.gpus * s.horizon),
        value=value,
        realtime_unmet=unmet,
        completed=completed,
        objective=decayed - s.realtime_penalty * unmet,
    )
