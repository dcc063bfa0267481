"""What forecasts change in planning: a scenario run step by step on estimated durations (pure).

A plan made on estimates cannot be scored on its own grid: jobs do not stop when the
plan says. So the scenario is *executed* the way the live allocator runs (docs/design.md §3's
rolling horizon): at every step the policy re-plans the rest of the horizon with every
waiting job at its estimated duration and every running job pinned where it is,
believed to end at its estimate (or next step, once it has overrun it); only the jobs
the plan starts *now* start. Every started job then runs for its true duration, the
scenario's. The executed grid is legal on the true durations, and value, utilisation
and completions are measured on it with the true scenario (`rota.core.planning.metrics`).
Realtime apps enter each re-plan holding the GPUs they held the step before, so the
swap cap holds across re-plans too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rota.core.planning.grid import Grid, Plan
from rota.core.planning.scenario import BatchJob, RealtimeApp, Running, Scenario

Policy = Callable[[Scenario], Plan]


def _step_scenario(s: Scenario, t: int, estimate: Mapping[str, int], started: Mapping[str, tuple[int, int]],
                   true: Mapping[str, int], grid: Grid) -> Scenario:
    batch: list[BatchJob] = []
    for j in s.batch:
        if j.id in started:
            start, first = started[j.id]
            if start + true[j.id] <= t:
                continue  # finished
            believed = max(estimate[j.id], t - start + 1)
            batch.append(BatchJob(id=j.id, kind=j.kind, tenant=j.tenant, priority=j.priority, gpus=j.gpus,
                                  duration=believed, arrival=0, running=Running(start - t, first)))
        elif j.arrival < s.horizon:
            batch.append(BatchJob(id=j.id, kind=j.kind, tenant=j.tenant, priority=j.priority, gpus=j.gpus,
                                  duration=estimate[j.id], arrival=max(0, j.arrival - t),
                                  gpu_types=j.gpu_types, same_switch=j.same_switch))
    realtime = tuple(
        RealtimeApp(id=r.id, tenant=r.tenant, demand=r.demand[t:], max_swap=r.max_swap, priority=r.priority,
                    held=tuple(g for g in range(s.gpus) if grid[g][t - 1] == r.id) if t else r.held,
                    gpu_types=r.gpu_types)
        for r in s.realtime)
    return Scenario(name=s.name, gpus=s.gpus, horizon=s.horizon - t, gpus_per_node=s.gpus_per_node,
                    step_seconds=s.step_seconds, decay=s.decay, realtime_penalty=s.realtime_penalty,
                    batch=tuple(batch), realtime=realtime, order=s.order,
                    node_types=s.node_types, node_switches=s.node_switches)


def execute(s: Scenario, estimate: Mapping[str, int], policy: Policy) -> Grid:
    """The grid that actually runs when `policy` re-plans every step on `estimate` (steps per job)."""
    true = {j.id: j.duration for j in s.batch}
    started: dict[str, tuple[int, int]] = {j.id: (j.running.started, j.running.first_gpu) for j in s.batch if j.running}
    gpus = {j.id: j.gpus for j in s.batch}
    grid: Grid = [[None] * s.horizon for _ in range(s.gpus)]
    realtime_ids = {r.id for r in s.realtime}
    for t in range(s.horizon):
        plan = _step_scenario(s, t, estimate, started, true, grid)
        column = [row[0] for row in policy(plan).grid]
        for g, cell in enumerate(column):
            if cell is None:
                continue
            if cell in realtime_ids:
                grid[g][t] = cell
            elif cell not in started:
                started[cell] = (t, g)  # the lowest GPU of its block comes first
        for job_id, (start, first) in started.items():
            if start <= t < start + true[job_id]:
                for g in range(first, first + gpus[job_id]):
                    grid[g][t] = job_id
    return grid
