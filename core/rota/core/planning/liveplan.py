"""The live cluster as a plan scenario, and the plan's first step as decisions (pure).

The policies plan a flat row of GPUs whose size is a power of two. A live cluster is a
set of nodes, so each live node gets a slot of `slot` rows (the largest node's GPU count,
rounded up to a power of two) and the slots stack in (switch, name) order, so the nodes of
one switch are adjacent. Rows that are no real GPU (a smaller node's tail, slots past the
last node) are pinned to a reservation for the whole horizon, so no policy can place
anything there, and every aligned block of at most `slot` GPUs lies inside one node: the
buddy rule of the grid is the node boundary. An aligned block of k x `slot` rows (k a power
of two) is then exactly k whole, adjacent nodes: that is how a gang (a job on several
nodes) is planned. Node GPU types and switches go into the scenario per slot, so every
policy's start masks (`rota.core.planning.constraints`) keep a job on its accepted types
and a same-switch gang under one switch.
A GPU the failure detector marked bad is pinned the same way, one row each, so it is given
to no job until an operator clears it (a job still running on it keeps it until it ends).

What is planned, step by step (the rolling horizon):
1. running batch-like jobs are pinned where they run, for their remaining duration;
2. realtime apps keep the GPUs they hold and follow their demand within the swap cap:
   each replica is one GPU, on any node of a type the app accepts, so an app grows past
   one node (on the nodes it runs on first) and its replicas on a lost node are placed
   again on the live ones;
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
    gpu_type: str = ""  # "" = untyped: only jobs that accept any type go there
    switch: str = ""  # the network switch it hangs off; "" = unknown
    cpus: float = 0.0  # what jobs' `cpus` may reserve on it; 0 = not reported, not checked
    memory_bytes: int = 0  # what jobs' `memory` may reserve on it; 0 = not reported, not checked

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
    # A gang: the spec's node count and GPUs on each (0: derive from `gpus`; 0: whole nodes).
    nodes: int = 0
    gpus_per_node: int = 0
    # A running gang's nodes in node-rank order (gang_nodes[0] == node); `gpu_indices` are
    # then the indices it uses on each of them, the same on every node.
    gang_nodes: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()  # accepted GPU types; empty = any
    same_switch: bool = False
    # A placed realtime app: its replicas' GPUs on each node it runs on (`node` first);
    # empty = all of them on `node` (`gpu_indices`).
    replicas: tuple[tuple[str, tuple[int, ...]], ...] = ()
    gpu_memory_mb: int = 0  # MiB it needs on each GPU (0: not said); guests in bubbles only
    cpus: float = 0.0  # what it reserves on each node it holds (rota.core.planning.resources)
    memory_bytes: int = 0

    @property
    def realtime(self) -> bool:
        return self.kind == "realtime"

    @property
    def replica_sets(self) -> dict[str, tuple[int, ...]]:
        """Node -> the GPUs of its replicas there, for a placed app ({} while waiting)."""
        if self.node is None:
            return {}
        return dict(self.replicas) if self.replicas else {self.node: self.gpu_indices}

    @property
    def held_gpus(self) -> int:
        """GPUs it holds now: its indices on each node it holds (0 while waiting)."""
        if self.replicas and self.node is not None:
            return sum(len(g) for _, g in self.replicas)
        return len(self.gpu_indices) * len(self.holding_nodes)

    @property
    def holding_nodes(self) -> tuple[str, ...]:
        """The nodes it holds GPUs on now: a running gang's nodes, a realtime app's, else its one node."""
        if self.node is None:
            return ()  # waiting (a paused gang may still name the nodes it ran on)
        return self.gang_nodes or tuple(self.replica_sets) or (self.node,)


def gang_shape(job: LiveJob, slot: int) -> tuple[int, int]:
    """(nodes k, ranks per node m) of a job planned on slots of `slot` rows; a gang when k > 1."""
    if job.nodes > 1:
        return job.nodes, job.gpus_per_node or slot
    if job.gpus > slot:
        return job.gpus // slot, slot
    return 1, job.gpus


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
    """A start; as a resize, one node's new GPU set of a realtime app (empty: it leaves the node)."""

    job_id: str
    node: str
    gpus: tuple[int, ...]  # a gang: the indices it uses on each of its nodes, 0..m-1
    nodes: tuple[str, ...] = ()  # a gang: all its nodes in node-rank order (nodes[0] == node)
    # A realtime app starting on several nodes: each node's GPUs, `node` (its home) first.
    replicas: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass
class StepDecision:
    starts: list[Start] = field(default_factory=list)
    resizes: list[Start] = field(default_factory=list)  # realtime apps' nodes whose GPU set changes now
    replica_sets: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # app -> node -> GPUs at step 0
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
    live = tuple(sorted((n for n in nodes if n.gpus > 0), key=lambda n: (n.switch, n.name)))
    layout = Layout(_pow2(max((n.gpus for n in live), default=1)), live)
    H = horizon.steps
    batch: list[BatchJob] = []
    realtime: list[RealtimeApp] = []
    excluded: dict[str, str] = {}
    # 1. Rows that are no GPU, or a bad one, are reserved for the whole horizon. A bad GPU
    #    that a job still holds is left to that job (its pin covers the row); it is
    #    reserved in the first plan after the job lets go.
    batch.extend(_reserved_rows(live, layout, jobs, H))
    # 2. Jobs, in arrival order.
    for j in jobs:
        if (why := _left_out(j, layout, held_back)) is not None:
            excluded[j.id] = why
        elif j.realtime:
            realtime.append(_realtime(j, layout, horizon))
        elif j.node is not None:
            batch.extend(_running(j, layout, horizon))
        elif (why := _unplannable(j, layout)) is not None:
            excluded[j.id] = why  # held, not failed: a node that fits may join
        else:
            steps = horizon.steps_for(j.duration_s) if j.duration_s else H
            batch.append(BatchJob(j.id, j.kind, j.tenant, j.priority, _block_rows(j, layout.slot), steps,
                                  gpu_types=frozenset(j.gpu_types), same_switch=j.same_switch))
    scenario = Scenario(
        name="live", gpus=layout.rows, horizon=H, gpus_per_node=layout.slot, step_seconds=max(1, round(horizon.step_s)),
        batch=tuple(batch), realtime=tuple(realtime), order=tuple(b.id for b in batch) + tuple(r.id for r in realtime),
        node_types=_slot_types(layout), node_switches=_slot_switches(layout),
    )
    return LiveScenario(scenario, layout, {j.id: j for j in jobs}, excluded)


def _reserved_rows(live: tuple[LiveNode, ...], layout: Layout, jobs: Sequence[LiveJob], H: int) -> list[BatchJob]:
    """Reserved blocks for the rows that are no GPU, and for the bad GPUs no job holds."""
    out: list[BatchJob] = []
    for i in range(layout.rows // layout.slot):
        real = live[i].gpus if i < len(live) else 0
        for first, size in _aligned_pieces(i * layout.slot + real, (i + 1) * layout.slot):
            out.append(_reserved(f"{RESERVED_PREFIX}none-{first}", first, size, H))
    held = {g for j in jobs if j.node is not None for g in _held_rows(j, layout)}
    for n in live:
        for g in sorted({g for g in n.bad_gpus if 0 <= g < n.gpus}):
            if layout.flat(n.name, g) not in held:
                out.append(_reserved(f"{RESERVED_PREFIX}bad-{n.name}-{g}", layout.flat(n.name, g), 1, H))
    return out


def _left_out(j: LiveJob, layout: Layout, held_back: Mapping[str, str] | None) -> str | None:
    """Why a job stays out of this plan: held back, or holding GPUs only on nodes that are not live."""
    if held_back and j.node is None and j.id in held_back:
        return held_back[j.id]
    if j.node is not None and not set(j.holding_nodes) & set(layout.offsets):
        where = ", ".join(j.holding_nodes)
        return f"holds GPUs on {where}, which {'is' if len(j.holding_nodes) == 1 else 'are'} not live"
    return None


def _block_rows(j: LiveJob, slot: int) -> int:
    """Rows a waiting job's block spans: its GPUs, or for a gang whole nodes. A gang with
    fewer ranks per node than a node has GPUs still holds its nodes whole (an aligned
    block of slots, a power of two of them): a block larger than a slot is whole slots in
    the grid, so the plan has no way to share a gang's node with another job."""
    k, m = gang_shape(j, slot)
    return _pow2(k) * slot if k > 1 else m


def _slot_types(layout: Layout) -> tuple[str, ...]:
    """Each slot's GPU type ("" past the last node), or () when no node is typed."""
    if not any(n.gpu_type for n in layout.nodes):
        return ()
    slots = layout.rows // layout.slot
    return tuple(layout.nodes[i].gpu_type if i < len(layout.nodes) else "" for i in range(slots))


def _slot_switches(layout: Layout) -> tuple[str, ...]:
    """Each slot's switch, or () when no node names one. A node of unknown switch, and
    every slot past the last node, gets a label of its own: it never joins a same-switch
    block, since nobody can say it shares one."""
    if not any(n.switch for n in layout.nodes):
        return ()
    slots = layout.rows // layout.slot
    return tuple((layout.nodes[i].switch or f"{RESERVED_PREFIX}{layout.nodes[i].name}") if i < len(layout.nodes)
                 else f"{RESERVED_PREFIX}slot-{i}" for i in range(slots))


def _unplannable(j: LiveJob, layout: Layout) -> str | None:
    """Why no plan could place a waiting job on the live nodes as they are, or None."""
    live = layout.nodes
    if not live:
        return "waiting: no live node in the cluster"
    types = set(j.gpu_types)
    of_type = f" of type {' or '.join(sorted(types))}" if types else ""
    typed = [n for n in live if not types or n.gpu_type in types]
    if not typed:
        return f"waiting: needs GPUs{of_type}; no live node has them"
    k, m = gang_shape(j, layout.slot)
    if k > 1:
        return _gang_unplannable(j, layout, k, m, typed, of_type)
    biggest = max(n.gpus for n in typed)
    if j.gpus > biggest:
        return f"waiting: needs {j.gpus} GPUs on one node{of_type}; the largest {'such' if types else 'live'} node has {biggest}"
    most = max(n.usable for n in typed)
    if j.gpus > most:
        return (f"waiting: needs {j.gpus} GPUs on one node{of_type}; with the GPUs marked bad taken out, "
                f"the most a live node has is {most} (see rota health)")
    return None


def _gang_unplannable(j: LiveJob, layout: Layout, k: int, m: int, typed: list[LiveNode], of_type: str) -> str | None:
    # A gang's block is whole slots, so only nodes that fill their slot can be in it.
    slot, blocks = layout.slot, _pow2(k)
    need = f"waiting: needs {k} nodes of {m} GPUs{of_type}"
    if blocks != k:
        need += f" (planned as an aligned block of {blocks} nodes)"
    if m > slot:
        return f"{need}; the largest live node has {max(n.gpus for n in layout.nodes)}"
    whole = [n for n in typed if n.gpus == slot]
    if len(whole) < blocks:
        return (f"{need}; the live cluster has {_nodes(len(whole))}{of_type} with {slot} GPUs or more"
                + ("; a gang holds whole nodes" if m < slot else ""))
    good = {n.name for n in whole if n.usable == n.gpus}
    if len(good) < blocks:
        return f"{need}; with the GPUs marked bad taken out, {_nodes(len(good))} have all {slot} (see rota health)"
    one_switch = j.same_switch and bool(_slot_switches(layout))  # unknown switches: no constraint
    best = _best_block(layout, good, blocks, one_switch)
    if best < blocks:
        if one_switch:
            return f"waiting: needs {blocks} nodes{of_type} under one switch; best now {best}"
        return f"{need} as an aligned block of whole nodes; the best block now has {best}"
    return None


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _best_block(layout: Layout, good: set[str], blocks: int, same_switch: bool) -> int:
    """The most usable nodes in one aligned block of `blocks` slots (under one switch when asked)."""
    switches = _slot_switches(layout) if same_switch else ()
    slots = layout.rows // layout.slot
    best = 0
    for first in range(0, slots, blocks):
        members = [i for i in range(first, min(first + blocks, len(layout.nodes))) if layout.nodes[i].name in good]
        if switches:
            labels = [switches[i] for i in members]
            best = max(best, max((labels.count(s) for s in labels), default=0))
        else:
            best = max(best, len(members))
    return best


def _reserved(job_id: str, first: int, size: int, horizon: int) -> BatchJob:
    return BatchJob(job_id, "training", "", 1, size, horizon, running=Running(0, first))


def _held_rows(j: LiveJob, layout: Layout) -> list[int]:
    """The rows a holding job keeps: its GPUs; a gang every GPU of its live nodes (it holds
    them whole, whatever it uses on each)."""
    offsets = layout.offsets
    if j.realtime and j.node is not None:
        return sorted(offsets[n] + g for n, gpus in j.replica_sets.items() if n in offsets for g in gpus)
    if j.gang_nodes and j.node is not None:
        size = {n.name: n.gpus for n in layout.nodes}
        return sorted(offsets[n] + g for n in j.gang_nodes if n in offsets for g in range(size[n]))
    if j.node not in offsets:
        return []
    return sorted(offsets[j.node] + g for g in j.gpu_indices)


def _running(j: LiveJob, layout: Layout, horizon: Horizon) -> list[BatchJob]:
    rows = _held_rows(j, layout)
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
    # Not an aligned block (placed by hand or by an older allocator, or a gang on nodes that
    # are not one aligned block of slots): pin each GPU alone.
    return [_reserved(f"{RESERVED_PREFIX}{j.id}-{g}", g, 1, remaining) for g in rows]


def _realtime(j: LiveJob, layout: Layout, horizon: Horizon) -> RealtimeApp:
    # Its replicas go on any node of its types, so it asks for at most what those have.
    types = set(j.gpu_types)
    cap = sum(n.usable for n in layout.nodes if not types or n.gpu_type in types)
    if j.demand and j.demand_from_now:
        demand = tuple(min(cap, j.demand[min(t, len(j.demand) - 1)]) for t in range(horizon.steps))
    elif j.demand:
        k = horizon.step_index
        demand = tuple(min(cap, j.demand[(k + t) % len(j.demand)]) for t in range(horizon.steps))
    else:
        demand = (min(cap, j.gpus),) * horizon.steps
    held = tuple(_held_rows(j, layout))
    if held:  # a running app keeps one replica at least: scaling to zero would stop it
        demand = tuple(max(1, d) for d in demand)
    return RealtimeApp(j.id, j.tenant, demand, j.max_swap or layout.rows, j.priority, held=held,
                       gpu_types=frozenset(j.gpu_types))


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
                out.starts.append(_start(ls.layout, job, sorted(steps[0]) if steps else []))
            elif active:
                out.planned_start[job_id] = active[0]
                out.waiting[job_id] = _planned_reason(ls, grid, job, active[0])
            else:
                out.waiting[job_id] = _unplanned_reason(ls, job, free_now)
    return out


def _start(layout: Layout, job: LiveJob, rows: list[int]) -> Start:
    k, m = gang_shape(job, layout.slot)
    if k > 1:  # its block is whole slots: the first k of them are its nodes, in rank order
        first = rows[0] // layout.slot
        names = tuple(n.name for n in layout.nodes[first:first + k])
        return Start(job.id, names[0], tuple(range(m)), names)
    node, index = layout.where(rows[0]) or ("", 0)
    return Start(job.id, node, tuple(range(index, index + len(rows))))


def _decide_realtime(ls: LiveScenario, job: LiveJob, rows: set[int], out: StepDecision) -> None:
    """A new app's Start with its GPUs per node; a placed app's changes, one resize per node:
    nodes it grows on first, then those it shrinks on, then those it leaves (a node it
    holds that is no longer live among them: its replicas were placed again elsewhere)."""
    planned: dict[str, list[int]] = {}
    for node, index in (p for p in (ls.layout.where(g) for g in sorted(rows)) if p is not None):
        planned.setdefault(node, []).append(index)
    if not planned:
        if job.node is None:
            out.waiting[job.id] = "waiting: no GPU free for its replicas in this step"
        return  # a placed app keeps what it has
    new = {n: tuple(g) for n, g in planned.items()}
    out.replica_sets[job.id] = new
    if job.node is None:
        home = max(new, key=lambda n: (len(new[n]), n))
        spread = ((home, new[home]), *((n, new[n]) for n in sorted(new) if n != home))
        out.starts.append(Start(job.id, home, new[home], replicas=spread if len(new) > 1 else ()))
        return
    held = {n: tuple(sorted(g)) for n, g in job.replica_sets.items()}
    grows = [n for n in sorted(new) if len(new[n]) >= len(held.get(n, ())) and new[n] != held.get(n)]
    shrinks = [n for n in sorted(new) if n in held and len(new[n]) < len(held[n])]
    out.resizes += [Start(job.id, n, new[n]) for n in grows + shrinks]
    out.resizes += [Start(job.id, n, ()) for n in sorted(held) if n not in new]


def _planned_reason(ls: LiveScenario, grid: Grid, job: LiveJob, step: int) -> str:
    when = step * ls.scenario.step_seconds
    # The jobs that hold its block the step before: what it waits for.
    before = {grid[g][step - 1] for g, row in enumerate(grid) if row[step] == job.id}
    ending = sorted(c for c in before if c and not c.startswith(RESERVED_PREFIX))
    after = f", after {', '.join(ending[:3])} {'ends' if len(ending) == 1 else 'end'}" if ending else ""
    return f"waiting: needs {_needs(job, ls.layout.slot)}; planned at step {step} (in ~{_human(when)}){after}"


def _unplanned_reason(ls: LiveScenario, job: LiveJob, free_now: int) -> str:
    return (f"waiting: needs {_needs(job, ls.layout.slot)}; none is free for it within the "
            f"{ls.scenario.horizon}-step plan ({free_now} GPUs free now)")


def _needs(job: LiveJob, slot: int) -> str:
    """What a waiting job's block is, in words: "an aligned 4-GPU block", or for a gang
    "2 nodes x 2 GPUs (an aligned 4-GPU block of whole nodes)"."""
    k, m = gang_shape(job, slot)
    what = (f"{k} nodes x {m} GPUs (an aligned {_block_rows(job, slot)}-GPU block of whole nodes)" if k > 1
            else f"an aligned {job.gpus}-GPU block")
    if job.gpu_types:
        what += f" of type {' or '.join(sorted(job.gpu_types))}"
    if job.same_switch and k > 1:
        what += " under one switch"
    return what


def _human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def figures(ls: LiveScenario, grid: Grid) -> dict[str, float | int]:
    """The docs/design.md §3 figures of a live plan, over real GPUs only (reservations left out)."""
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
