"""The live cluster as a plan scenario, and the plan's first step as decisions (pure).

The policies plan a flat row of GPUs whose size is a power of two. A live cluster is a
set of nodes, so each live node gets a slot of `slot` rows (the largest node's GPU count,
rounded up to a power of two) and the slots stack in name order. Rows that are no real
GPU (a smaller node's tail, slots past the last node) are pinned to a reservation for the
whole horizon, so no policy can place anything there, and every aligned block of at most
`slot` GPUs lies inside one node: the buddy rule of the grid is the node boundary.
A GPU the failure detector marked bad is pinned the same way, one row each, so it is given
to no job until an operator clears it (a job still running on it keeps it until it ends).

What is planned, step by step (the rolling horizon):
1. running batch-like jobs are pinned where they run, for their remaining duration;
2. realtime apps keep the GPUs they hold and follow their demand within the swap cap;
3. waiting jobs are placed by the policy; only step 0 is committed, the rest is the
   reason a waiting job can read ("planned at step 3, after ft-1 ends").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rota.core.planning.grid import Grid, cells_by_job
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import BatchJob, RealtimeApp, Running, Scenario

RESERVED_PREFIX = "~"  # grid ids of rows that are not a usable GPU


@dataclass(frozen=True)
class LiveNode:
    name: str
    gpus: int
    bad_gpus: tuple[int, ...] = ()  # indices the failure detector took out of the plan

    @property
    def usable(self) -> int:
        """GPUs a new job can be given: all but the bad ones."""
        return self.gpus - len({g for g in self.bad_gpus if 0 <= g < self.gpus})


@dataclass(frozen=True)
class LiveJob:
    """A job as the planner sees it; `node` is set while it holds GPUs."""

    id: str
    tenant: str
    kind: str
    priority: int
    gpus: int
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    elapsed_s: float = 0.0  # since it was given GPUs
    duration_s: float | None = None  # declared or forecast; None = unknown
    demand: tuple[int, ...] = ()  # realtime: GPUs wanted per step, indexed by wall-clock step
    demand_from_now: bool = False  # realtime: `demand` is a forecast whose first value is step 0
    max_swap: int = 0  # realtime: 0 = no cap
    preemptible: bool = False
    restart: str = "never"

    @property
    def realtime(self) -> bool:
        return self.kind == "realtime"


@dataclass(frozen=True)
class Horizon:
    step_s: float
    steps: int
    now_s: float  # seconds since the Unix epoch

    @property
    def step_index(self) -> int:
        """The absolute number of the current step: what realtime demand curves are indexed by."""
        return int(self.now_s // self.step_s)

    def steps_for(self, seconds: float) -> int:
        return max(1, math.ceil(seconds / self.step_s - 1e-9))


@dataclass(frozen=True)
class Layout:
    slot: int
    nodes: tuple[LiveNode, ...]

    @property
    def offsets(self) -> dict[str, int]:
        return {n.name: i * self.slot for i, n in enumerate(self.nodes)}

    @property
    def rows(self) -> int:
        return _pow2(max(1, len(self.nodes)) * self.slot)

    def flat(self, node: str, index: int) -> int:
        return self.offsets[node] + index

    def where(self, row: int) -> tuple[str, int] | None:
        i, index = divmod(row, self.slot)
        if i < len(self.nodes) and index < self.nodes[i].gpus:
            return self.nodes[i].name, index
        return None


@dataclass
class LiveScenario:
    scenario: Scenario
    layout: Layout
    jobs: dict[str, LiveJob]
    excluded: dict[str, str] = field(default_factory=dict)  # job id -> why it is not planned


@dataclass(frozen=True)
class Start:
    job_id: str
    node: str
    gpus: tuple[int, ...]


@dataclass
class StepDecision:
    starts: list[Start] = field(default_factory=list)
    resizes: list[Start] = field(default_factory=list)  # realtime apps whose GPU set changes now
    waiting: dict[str, str] = field(default_factory=dict)
    planned_start: dict[str, int] = field(default_factory=dict)  # waiting job -> step it is planned at


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _aligned_pieces(first: int, last: int) -> Iterable[tuple[int, int]]:
    """[first, last) as aligned power-of-two blocks (first, size)."""
    while first < last:
        size = first & -first if first else _pow2(last)
        while first + size > last:
            size //= 2
        yield first, size
        first += size


def build(
    nodes: Sequence[LiveNode], jobs: Sequence[LiveJob], horizon: Horizon, held_back: Mapping[str, str] | None = None
) -> LiveScenario:
    """The scenario to plan now. `jobs` is every holding job plus the queue in arrival order.

    `held_back` maps waiting jobs kept out of this plan to the reason (a job that just
    yielded its lease waits until the job it yielded to has started).
    """
    live = tuple(sorted((n for n in nodes if n.gpus > 0), key=lambda n: n.name))
    layout = Layout(_pow2(max((n.gpus for n in live), default=1)), live)
    H = horizon.steps
    batch: list[BatchJob] = []
    realtime: list[RealtimeApp] = []
    excluded: dict[str, str] = {}
    # 1. Rows that are no GPU, or a bad one, are reserved for the whole horizon. A bad GPU
    #    that a job still holds is left to that job (its pin covers the row); it is
    #    reserved in the first plan after the job lets go.
    for i in range(layout.rows // layout.slot):
        real = live[i].gpus if i < len(live) else 0
        for first, size in _aligned_pieces(i * layout.slot + real, (i + 1) * layout.slot):
            batch.append(_reserved(f"{RESERVED_PREFIX}none-{first}", first, size, H))
    held = {layout.flat(j.node, g) for j in jobs if j.node in layout.offsets for g in j.gpu_indices}
    for n in live:
        for g in sorted({g for g in n.bad_gpus if 0 <= g < n.gpus}):
            if layout.flat(n.name, g) not in held:
                batch.append(_reserved(f"{RESERVED_PREFIX}bad-{n.name}-{g}", layout.flat(n.name, g), 1, H))
    # 2. Jobs, in arrival order.
    for j in jobs:
        if held_back and j.node is None and j.id in held_back:
            excluded[j.id] = held_back[j.id]
            continue
        if j.node is not None and j.node not in layout.offsets:
            excluded[j.id] = f"holds GPUs on {j.node}, which is not live"
            continue
        if j.realtime:
            realtime.append(_realtime(j, layout, horizon))
        elif j.node is not None:
            batch.extend(_running(j, layout, horizon))
        elif not live:
            excluded[j.id] = "waiting: no live node in the cluster"
        elif j.gpus > layout.slot or j.gpus > max(n.gpus for n in live):
            biggest = max(n.gpus for n in live)
            excluded[j.id] = f"waiting: needs {j.gpus} GPUs on one node; the largest live node has {biggest}"
        elif j.gpus > max(n.usable for n in live):
            most = max(n.usable for n in live)
            excluded[j.id] = (f"waiting: needs {j.gpus} GPUs on one node; with the GPUs marked bad taken out, "
                              f"the most a live node has is {most} (see rota health)")
        else:
            steps = horizon.steps_for(j.duration_s) if j.duration_s else H
            batch.append(BatchJob(j.id, j.kind, j.tenant, j.priority, j.gpus, steps))
    scenario = Scenario(
        name="live", gpus=layout.rows, horizon=H, gpus_per_node=layout.slot, step_seconds=max(1, round(horizon.step_s)),
        batch=tuple(batch), realtime=tuple(realtime), order=tuple(b.id for b in batch) + tuple(r.id for r in realtime),
    )
    return LiveScenario(scenario, layout, {j.id: j for j in jobs}, excluded)


def _reserved(job_id: str, first: int, size: int, horizon: int) -> BatchJob:
    return BatchJob(job_id, "training", "", 1, size, horizon, running=Running(0, first))


def _running(j: LiveJob, layout: Layout, horizon: Horizon) -> list[BatchJob]:
    rows = sorted(layout.flat(j.node or "", g) for g in j.gpu_indices)
    elapsed = int(j.elapsed_s // horizon.step_s)
    if j.duration_s is None:
        remaining = horizon.steps  # unknown: it holds its GPUs through the whole plan
    elif j.duration_s > j.elapsed_s:
        remaining = horizon.steps_for(j.duration_s - j.elapsed_s)
    else:
        remaining = 1  # it has overrun its estimate: assume it ends within this step
    n = len(rows)
    if n and n & (n - 1) == 0 and rows == list(range(rows[0], rows[0] + n)) and rows[0] % n == 0:
        return [BatchJob(j.id, j.kind, j.tenant, j.priority, n, elapsed + remaining, running=Running(-elapsed, rows[0]))]
    # Not an aligned block (placed by hand or by an older allocator): pin each GPU alone.
    return [_reserved(f"{RESERVED_PREFIX}{j.id}-{g}", g, 1, remaining) for g in rows]


def _realtime(j: LiveJob, layout: Layout, horizon: Horizon) -> RealtimeApp:
    # A live app's replicas share one node, so it never asks for more than a node holds.
    cap = min(layout.slot, max((n.gpus for n in layout.nodes), default=0))
    if j.demand and j.demand_from_now:
        demand = tuple(min(cap, j.demand[min(t, len(j.demand) - 1)]) for t in range(horizon.steps))
    elif j.demand:
        k = horizon.step_index
        demand = tuple(min(cap, j.demand[(k + t) % len(j.demand)]) for t in range(horizon.steps))
    else:
        demand = (min(cap, j.gpus),) * horizon.steps
    held = tuple(sorted(layout.flat(j.node, g) for g in j.gpu_indices)) if j.node else ()
    if held:  # a running app keeps one replica at least: scaling to zero would stop it
        demand = tuple(max(1, d) for d in demand)
    return RealtimeApp(j.id, j.tenant, demand, j.max_swap or layout.rows, j.priority, held=held)


def decide(ls: LiveScenario, grid: Grid) -> StepDecision:
    """Step 0 of the plan as starts and resizes; a reason for every job left waiting."""
    out = StepDecision(waiting=dict(ls.excluded))
    held = cells_by_job(grid)
    free_now = sum(1 for g, row in enumerate(grid) if row[0] is None and ls.layout.where(g) is not None)
    for job_id, job in ls.jobs.items():
        if job_id in ls.excluded:
            continue
        steps = held.get(job_id)
        if job.realtime:
            _decide_realtime(ls, job, steps[0] if steps else set(), out)
        elif job.node is None:
            active = [t for t, g in enumerate(steps or []) if g]
            if active and active[0] == 0:
                rows = sorted(steps[0]) if steps else []
                node, first = ls.layout.where(rows[0]) or ("", 0)
                out.starts.append(Start(job_id, node, tuple(range(first, first + len(rows)))))
            elif active:
                out.planned_start[job_id] = active[0]
                out.waiting[job_id] = _planned_reason(ls, grid, job, active[0])
            else:
                out.waiting[job_id] = _unplanned_reason(ls, job, free_now)
    return out


def _decide_realtime(ls: LiveScenario, job: LiveJob, rows: set[int], out: StepDecision) -> None:
    placed = [p for p in (ls.layout.where(g) for g in sorted(rows)) if p is not None]
    home = job.node
    if home is None:
        if not placed:
            out.waiting[job.id] = "waiting: no GPU free for its replicas in this step"
            return
        names = [n for n, _ in placed]
        home = max(set(names), key=lambda n: (names.count(n), n))
    gpus = tuple(sorted(i for n, i in placed if n == home))
    if job.node is None:
        out.starts.append(Start(job.id, home, gpus))
    elif gpus != tuple(sorted(job.gpu_indices)) and gpus:
        out.resizes.append(Start(job.id, home, gpus))


def _planned_reason(ls: LiveScenario, grid: Grid, job: LiveJob, step: int) -> str:
    when = step * ls.scenario.step_seconds
    # The jobs that hold its block the step before: what it waits for.
    before = {grid[g][step - 1] for g, row in enumerate(grid) if row[step] == job.id}
    ending = sorted(c for c in before if c and not c.startswith(RESERVED_PREFIX))
    after = f", after {', '.join(ending[:3])} {'ends' if len(ending) == 1 else 'end'}" if ending else ""
    return f"waiting: needs an aligned {job.gpus}-GPU block; planned at step {step} (in ~{_human(when)}){after}"


def _unplanned_reason(ls: LiveScenario, job: LiveJob, free_now: int) -> str:
    return (f"waiting: needs an aligned {job.gpus}-GPU block; none is free for it within the "
            f"{ls.scenario.horizon}-step plan ({free_now} GPUs free now)")


def _human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def figures(ls: LiveScenario, grid: Grid) -> dict[str, float | int]:
    """The SPEC §3 figures of a live plan, over real GPUs only (reservations left out)."""
    s = ls.scenario
    real = [j for j in s.batch if not j.id.startswith(RESERVED_PREFIX)]
    clean = replace(s, batch=tuple(real))
    clean_grid = [[c if c and not c.startswith(RESERVED_PREFIX) else None for c in row] for row in grid]
    m = measure(clean, clean_grid)
    bad = sum(1 for j in s.batch if j.id.startswith(f"{RESERVED_PREFIX}bad-"))
    real_gpus = sum(n.gpus for n in ls.layout.nodes) - bad
    return {
        "utilization": m.utilization * s.gpus / real_gpus if real_gpus else 0.0,
        "value": m.value, "realtime_unmet": m.realtime_unmet, "completed": m.completed, "objective": m.objective,
    }
