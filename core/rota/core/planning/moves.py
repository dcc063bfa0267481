"""Moving running jobs, priced (docs/design.md §6 on the allocator's side). Pure: plain data in and out.

A job that can be checkpointed (it has a complete image, so the coordinator can pause it
at a safe point) is no longer pinned for good. Three moves use that:

1. Resume targets: a job resumed or migrated `--to NODE` starts only on that node while
   the node is live; it is placed there before the policy runs, so the policy plans the
   rest around it.
2. Priced preemption (`fast`, `full`): a started `preemptible` job is paused and requeued
   when the plan without it is worth more than the plan with it, by more than the cost of
   pausing and restoring it, and a higher-priority waiting job takes its GPUs at once.
   The policy itself prices the alternative: the same policy plans the horizon twice.
3. Fragmentation repair: a waiting job that needs an aligned block, where every GPU of
   some block is free or held by a movable job of no higher priority that fits elsewhere
   now, gets the block by migrating those jobs, when the steps it would wait are worth
   more than their moves. A moved job waits until that job has started, so it cannot
   land back in the block it was moved out of.

A moved job is not moved again for a while (the caller lists it in `busy`): each move is
worth its cost on its own, but a job bounced between blocks would lose work every time.

A gang (a job on several nodes) is never moved by any of the three: its ranks restart
together, on the nodes the plan gives them, so it is neither pinned to one node, paused
for another job, nor migrated out of a block; a waiting gang is not the beneficiary of a
repair either (a repair frees a block on one node).

Costs are in the units of the objective (docs/design.md §3): priority x GPU-steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rota.core.planning.grid import Grid
from rota.core.planning.liveplan import (
    RESERVED_PREFIX,
    Horizon,
    LiveJob,
    LiveNode,
    LiveScenario,
    Start,
    StepDecision,
    gang_shape,
)

MAX_PREEMPTION_CANDIDATES = 3  # each one costs the policy a second plan of the horizon


@dataclass(frozen=True)
class MoveCost:
    """A job's measured cost of a move: request to GPUs released, and image to running again."""

    pause_s: float
    restore_s: float

    @property
    def seconds(self) -> float:
        return self.pause_s + self.restore_s


@dataclass(frozen=True)
class MoveInputs:
    costs: Mapping[str, MoveCost] = field(default_factory=dict)  # jobs that can be paused (have an image)
    targets: Mapping[str, str] = field(default_factory=dict)  # pending job -> node asked for (--to)
    busy: frozenset[str] = frozenset()  # jobs with a pause or migration under way
    # Jobs moved off their GPUs -> the job they made room for, until it has started: those
    # GPUs are promised (the lease yields of the next cycles must not give them again).
    yielded_to: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Preemption:
    job_id: str
    node: str
    for_job: str
    gain: float
    cost: float
    reason: str


@dataclass(frozen=True)
class Migration:
    job_id: str
    from_node: str
    to_node: str
    for_job: str
    gain: float
    cost: float
    reason: str


# 1. Resume targets.
def pin_targets(
    nodes: Sequence[LiveNode], jobs: Sequence[LiveJob], targets: Mapping[str, str]
) -> tuple[list[LiveJob], list[Start], dict[str, str]]:
    """Places each pending job that asked for a node on a free aligned block there.

    Returns the jobs (pinned ones now holding their block, so the policy plans around
    them), the starts to commit, and the waiting reasons of pinned jobs that did not fit.
    A target that is not a live node is ignored: the job goes wherever the policy puts it.
    """
    live = {n.name: n for n in nodes if n.gpus > 0}
    slot = _pow2_at_least(max((n.gpus for n in live.values()), default=1))
    used: dict[str, set[int]] = {n.name: set(n.bad_gpus) for n in live.values()}  # a bad GPU is given to no one
    for j in jobs:
        for name in j.holding_nodes[1:]:  # a running gang holds its nodes whole
            used.setdefault(name, set()).update(range(live[name].gpus if name in live else 0))
        if j.node is not None:
            used.setdefault(j.node, set()).update(range(live[j.node].gpus) if j.gang_nodes and j.node in live
                                                  else j.gpu_indices)
    out: list[LiveJob] = []
    starts: list[Start] = []
    waiting: dict[str, str] = {}
    for j in jobs:
        target = targets.get(j.id)
        if (j.node is not None or j.realtime or target is None or target not in live
                or gang_shape(j, slot)[0] > 1):  # a gang restarts where the plan puts it
            out.append(j)
            continue
        node = live[target]
        taken = used.setdefault(target, set())
        block = _free_block(node.gpus, taken, j.gpus)
        if block is None:
            free = node.gpus - len(taken & set(range(node.gpus)))
            waiting[j.id] = (f"waiting: asked to run on {target}; no aligned {j.gpus}-GPU block is free there "
                             f"({free} of {node.gpus} GPUs free)")
            out.append(j)
            continue
        taken.update(block)
        out.append(replace(j, node=target, gpu_indices=block, elapsed_s=0.0))
        starts.append(Start(j.id, target, block))
    return out, starts, waiting


def _free_block(gpus: int, taken: set[int], size: int) -> tuple[int, ...] | None:
    """The free aligned block in the most used neighbourhood (best fit), so the largest
    free blocks stay whole: a job moved off a block to free it does not land back in it."""
    best: tuple[int, int] | None = None  # (size of the largest free block around it, first)
    for first in range(0, gpus - size + 1, size):
        if taken.intersection(range(first, first + size)):
            continue
        around = size
        while around * 2 <= _pow2_at_most(gpus):
            start = first - first % (around * 2)
            if start + around * 2 > gpus or taken.intersection(range(start, start + around * 2)):
                break
            around *= 2
        if best is None or around < best[0]:
            best = (around, first)
    return tuple(range(best[1], best[1] + size)) if best is not None else None


def _pow2_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def _pow2_at_least(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _is_gang(live: LiveScenario, j: LiveJob) -> bool:
    return bool(j.gang_nodes) or gang_shape(j, live.layout.slot)[0] > 1


# 2. Priced preemption.
Solve = Callable[[Sequence[LiveJob]], tuple[LiveScenario, Grid, float]]  # jobs -> (scenario, grid, objective)


def price_preemptions(
    jobs: Sequence[LiveJob], horizon: Horizon, solve: Solve, base: tuple[LiveScenario, Grid, float],
    decision: StepDecision, inputs: MoveInputs, limit: int = MAX_PREEMPTION_CANDIDATES,
) -> Preemption | None:
    """The one preemption worth most this cycle, if any is worth its cost.

    For each candidate (a started, preemptible, batch-like job with a measured cost and no
    move under way; lowest priority first), the policy plans again with the candidate
    paused and back in the queue. It is chosen when a waiting job of higher priority
    starts at step 0 on its GPUs and the objective gained exceeds its priority x GPUs x
    (pause + restore) / step: the value its own work loses to the move.
    """
    live, _, base_objective = base
    waiting = [w for w in jobs if w.node is None and not w.realtime and w.id in decision.waiting
               and w.id not in live.excluded]
    if not waiting:
        return None
    top = max(w.priority for w in waiting)
    candidates = sorted(
        (j for j in jobs if j.node is not None and not j.realtime and j.preemptible and j.id in inputs.costs
         and j.id not in inputs.busy and j.id not in live.excluded and j.priority < top and not _is_gang(live, j)),
        key=lambda j: (j.priority, len(j.gpu_indices), j.id),  # the cheapest moves first
    )[:limit]
    best: Preemption | None = None
    for victim in candidates:
        paused = replace(victim, node=None, gpu_indices=(), elapsed_s=0.0, duration_s=_remaining(victim))
        alt_live, alt_grid, alt_objective = solve([j for j in jobs if j.id != victim.id] + [paused])
        rows = [alt_live.layout.flat(victim.node or "", g) for g in victim.gpu_indices]
        takers = sorted({c for g in rows if (c := alt_grid[g][0]) and c in alt_live.jobs
                         and alt_live.jobs[c].node is None and alt_live.jobs[c].priority > victim.priority})
        if not takers:
            continue
        gain = alt_objective - base_objective
        cost = _move_cost(victim, inputs, horizon)
        if gain <= cost or (best is not None and gain - cost <= best.gain - best.cost):
            continue
        taker = max(takers, key=lambda c: (alt_live.jobs[c].priority, c))
        reason = (f"paused for {taker} (priority {alt_live.jobs[taker].priority} > {victim.priority}): "
                  f"the plan gains {gain:.3g} for a move costing {cost:.3g}")
        best = Preemption(victim.id, victim.node or "", taker, gain, cost, reason)
    return best


def _move_cost(job: LiveJob, inputs: MoveInputs, horizon: Horizon) -> float:
    """The value a move takes from the moved job: its priority x GPUs x (pause + restore) / step."""
    return job.priority * len(job.gpu_indices) * inputs.costs[job.id].seconds / horizon.step_s


def _remaining(j: LiveJob) -> float | None:
    if j.duration_s is None:
        return None
    return max(1.0, j.duration_s - j.elapsed_s)


# 3. Fragmentation repair.
def repair_fragmentation(
    live: LiveScenario, grid: Grid, decision: StepDecision, horizon: Horizon, inputs: MoveInputs,
) -> list[Migration]:
    """Migrations that free an aligned block now for the highest-priority waiting job that
    has none: the cheapest such block, if its wait is worth more than the moves."""
    waiting = sorted(
        (j for j in live.jobs.values() if j.node is None and not j.realtime and j.id in decision.waiting
         and j.id not in live.excluded and j.id not in inputs.targets and not _is_gang(live, j)),
        key=lambda j: -j.priority,
    )
    for job in waiting:
        wait_steps = decision.planned_start.get(job.id, horizon.steps)
        gain = job.priority * job.gpus * wait_steps
        best: tuple[float, list[Migration]] | None = None
        for first in range(0, len(grid) - job.gpus + 1, job.gpus):
            moves = _clear_block(live, grid, first, job.gpus, horizon, inputs, job.priority)
            if moves is None:
                continue
            cost = sum(_move_cost(live.jobs[m], inputs, horizon) for m, _ in moves)
            if best is None or cost < best[0]:
                reason = f"moved to free an aligned {job.gpus}-GPU block for {job.id}"
                best = (cost, [Migration(m, live.jobs[m].node or "", to, job.id, gain, cost, reason) for m, to in moves])
        if best is not None and best[0] < gain:
            return best[1]
    return []


def _clear_block(
    live: LiveScenario, grid: Grid, first: int, size: int, horizon: Horizon, inputs: MoveInputs, for_priority: int,
) -> list[tuple[str, str]] | None:
    """(job, node) moves that empty rows [first, first + size) at step 0, or None."""
    rows = range(first, first + size)
    where = [live.layout.where(g) for g in rows]
    if any(w is None for w in where) or len({w[0] for w in where if w}) != 1:
        return None
    occupants = _movable_occupants(live, grid, rows, inputs, for_priority)
    if occupants is None:
        return None
    if not occupants:
        return None  # already free: the policy chose not to use it
    taken = set(rows)
    moves: list[tuple[str, str]] = []
    for job_id in sorted(occupants, key=lambda i: -len(live.jobs[i].gpu_indices)):
        job = live.jobs[job_id]
        steps = horizon.steps if job.duration_s is None else min(horizon.steps, horizon.steps_for(_remaining(job) or 1))
        dest = _free_rows(live, grid, len(job.gpu_indices), steps, taken)
        if dest is None:
            return None
        taken.update(range(dest, dest + len(job.gpu_indices)))
        node = live.layout.where(dest)
        moves.append((job_id, node[0] if node else ""))
    return moves


def _movable_occupants(
    live: LiveScenario, grid: Grid, rows: range, inputs: MoveInputs, for_priority: int,
) -> list[str] | None:
    """The jobs holding `rows` at step 0, in row order, or None if any of them may not move."""
    occupants: list[str] = []
    for g in rows:
        cell = grid[g][0]
        if cell is None:
            continue
        if cell.startswith(RESERVED_PREFIX) or cell not in live.jobs:
            return None
        job = live.jobs[cell]
        if job.node is None or job.realtime or cell not in inputs.costs or cell in inputs.busy or _is_gang(live, job):
            return None  # starting now, a realtime app, a gang, or a job that cannot be paused
        if job.priority > for_priority:
            return None  # never moved for less important work
        if cell not in occupants:
            occupants.append(cell)
    return occupants


def _free_rows(live: LiveScenario, grid: Grid, size: int, steps: int, taken: set[int]) -> int | None:
    """The first aligned block of `size` rows on one real node, free for `steps` steps."""
    for first in range(0, len(grid) - size + 1, size):
        block = range(first, first + size)
        spots = [live.layout.where(g) for g in block]
        if any(s is None for s in spots) or len({s[0] for s in spots if s}) != 1 or taken.intersection(block):
            continue
        if all(grid[g][t] is None for g in block for t in range(min(steps, len(grid[g])))):
            return first
    return None
