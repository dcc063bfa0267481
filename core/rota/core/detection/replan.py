"""The 3-D re-plan around slow and dead devices (pure; docs/design.md §7).

Given the layout and each device's speed (1 nominal, 0 dead, 1/1.3 for a 1.3× slowdown):
1. tensor parallelism: a TP group runs at its slowest member, so in every replica with an
   affected device the live devices are regrouped by speed (like with like: one group
   takes the slow devices instead of every group taking one), and a group short of a
   dead member shrinks to a smaller TP degree (a divisor of tp, so heads still split);
   the grouping maximises the replica's total speed, keeping the most devices busy;
2. pipeline: layers ∝ stage speed, minimising the slowest stage (each stage ≥ 1 layer; a
   device holds at most `memory_factor` × its original share of layers);
3. data parallelism: micro-batches go one at a time to the replica that finishes them
   earliest, i.e. ∝ replica throughput, the global batch unchanged.
Throughput is micro-batches per unit time over the 1F1B makespan, relative to the
healthy layout (1.0). Beside the re-plan: the layout as it is (0 with a dead device: a
synchronous job stalls) and dropping every affected data-parallel replica.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache

from rota.core.detection.layout import Layout
from rota.core.detection.pipeline import uniform_makespan
from rota.core.errors import FailedPrecondition, InvalidArgument

AFFECTED_BELOW = 0.95  # a device slower than this share of nominal speed is affected
# Bounds that keep one answer within a second or so of pure Python.
MAX_RANKS = 4096
MAX_PP = 64
MAX_LAYERS = 1024
MAX_MICROBATCHES = 256
ORDER_SEARCH_PP = 16  # up to this depth the slowest stage tries every pipeline position


@dataclass(frozen=True)
class StagePlan:
    replica: int
    stage: int
    ranks: tuple[int, ...]  # the devices (by original rank) of this stage's TP group
    layers: int
    speed: float  # TP degree × its slowest member's speed


@dataclass(frozen=True)
class Replan:
    layout: Layout
    stages: tuple[StagePlan, ...]
    microbatches: tuple[int, ...]  # per replica; 0 = the replica is left out
    idle: tuple[int, ...]  # live devices given no work
    throughput_before: float
    throughput_after: float
    throughput_drop_group: float

    def layers_of_rank(self, rank: int) -> int:
        """The layers the device `rank` (original numbering) holds in the plan; 0 if idle.
        Not layers_per_stage[rank]: a re-plan may move a device to another pipeline position."""
        return next((st.layers for st in self.stages if rank in st.ranks), 0)

    @property
    def layers_per_stage(self) -> list[int]:
        """Replica-major: [replica 0 stage 0, replica 0 stage 1, …]; 0 for a left-out replica."""
        out = [0] * (self.layout.dp * self.layout.pp)
        for st in self.stages:
            out[st.replica * self.layout.pp + st.stage] = st.layers
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout.as_dict(), "stages": [asdict(s) for s in self.stages],
            "layers_per_stage": self.layers_per_stage, "microbatches_per_replica": list(self.microbatches),
            "idle_ranks": list(self.idle), "throughput_before": round(self.throughput_before, 4),
            "throughput_after": round(self.throughput_after, 4), "throughput_drop_group": round(self.throughput_drop_group, 4),
        }


def equal_layers(layers: int, pp: int) -> list[int]:
    return [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


def balance_layers(speeds: Sequence[float], caps: Sequence[int], layers: int) -> list[int] | None:
    """Integer layers minimising max(layers / speed): greedy, optimal for unit jobs on uniform machines."""
    if len(speeds) > layers or any(c < 1 for c in caps) or sum(caps) < layers:
        return None
    out = [1] * len(speeds)
    for _ in range(layers - len(speeds)):
        options = [s for s in range(len(speeds)) if out[s] < caps[s]]
        best = min(options, key=lambda s: ((out[s] + 1) / speeds[s], s))
        out[best] += 1
    return out


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(g for g in range(n, 0, -1) if n % g == 0)


def regroup(devices: Sequence[tuple[int, float]], tp: int, pp: int) -> list[tuple[int, ...]] | None:
    """`pp` TP groups from live (rank, speed) devices maximising Σ size × slowest member.

    Sorted by speed, the best groups are runs of neighbours (an exchange argument); the
    slowest devices may be left idle. Ties go to using more devices. None if fewer than
    `pp` devices live.
    """
    order = sorted((d for d in devices if d[1] > 0), key=lambda d: (-d[1], d[0]))
    n = len(order)
    if n < pp:
        return None
    sizes = _divisors(tp)

    @cache
    def best(i: int, k: int) -> tuple[float, int, tuple[int, ...]]:
        if k == 0:
            return 0.0, 0, ()
        options: list[tuple[float, int, tuple[int, ...]]] = []
        for g in sizes:
            if i + g <= n and n - (i + g) >= k - 1:
                speed, used, rest = best(i + g, k - 1)
                options.append((speed + g * order[i + g - 1][1], used + g, (g, *rest)))
        return max(options, key=lambda o: (round(o[0], 9), o[1]))

    _, _, chosen = best(0, pp)
    groups, at = [], 0
    for g in chosen:
        groups.append(tuple(sorted(r for r, _ in order[at : at + g])))
        at += g
    return sorted(groups)


@dataclass
class _Replica:
    groups: list[tuple[int, ...]]
    layers: list[int]
    speeds: list[float]

    def stage_seconds(self) -> tuple[float, ...]:
        return tuple(n / v for n, v in zip(self.layers, self.speeds, strict=True))


def _group_speed(group: Sequence[int], speeds: Sequence[float]) -> float:
    return len(group) * min(speeds[r] for r in group)


def _as_is(layout: Layout, speeds: Sequence[float], d: int, layers: int) -> _Replica | None:
    groups = [tuple(layout.group(s, d)) for s in range(layout.pp)]
    v = [_group_speed(g, speeds) for g in groups]
    return None if min(v) <= 0 else _Replica(groups, equal_layers(layers, layout.pp), v)


def _orders(groups: list[tuple[int, ...]], hit: list[tuple[int, ...]], pooled: list[tuple[int, ...]],
            speeds: Sequence[float], keep_order: bool) -> list[list[tuple[int, ...]]]:
    """The pipeline orders to try: with `keep_order`, the regrouped devices take the affected
    groups' positions and nothing else moves; else the slowest group at every position."""
    if keep_order:
        order, fill = list(groups), iter(pooled)
        return [[next(fill) if g in hit else g for g in order]]
    kept = sorted([g for g in groups if g not in hit] + pooled)
    slowest = min(kept, key=lambda g: (_group_speed(g, speeds), g))
    rest = [g for g in kept if g != slowest]
    return [[*rest[:at], slowest, *rest[at:]] for at in (range(len(groups)) if len(groups) <= ORDER_SEARCH_PP else [len(rest)])]


def _replanned(
    layout: Layout, speeds: Sequence[float], d: int, layers: int, memory_factor: float, microbatches: int,
    keep_order: bool = False,
) -> _Replica | None:
    """Regroups the devices of this replica's affected TP groups (intact groups stay as they
    are), balances layers, and puts the slowest group at the pipeline position where the
    1F1B makespan is shortest (a slow stage costs less where the bubbles hide it), unless
    `keep_order`: a job whose stages are not interchangeable (the first embeds and reads the
    data, the last holds the head and the loss) keeps each device at its position."""
    groups = [tuple(layout.group(s, d)) for s in range(layout.pp)]
    hit = [g for g in groups if any(speeds[r] < AFFECTED_BELOW for r in g)]
    pooled = regroup([(r, speeds[r]) for g in hit for r in g], layout.tp, len(hit))
    if pooled is None:
        return None
    best: _Replica | None = None
    for order in _orders(groups, hit, pooled, speeds, keep_order):
        v = [_group_speed(g, speeds) for g in order]
        share = layers / (layout.pp * layout.tp)  # layers one device held before
        caps = [max(1, int(memory_factor * len(g) * share + 1e-9)) for g in order]
        split = balance_layers(v, caps, layers)
        if split is None:
            continue
        candidate = _Replica(order, split, v)
        if best is None or _span(candidate.stage_seconds(), microbatches) < _span(best.stage_seconds(), microbatches) - 1e-12:
            best = candidate
    return best


def assign_microbatches(replicas: Sequence[_Replica | None], total: int) -> tuple[list[int], float]:
    """Micro-batches one at a time to the replica that would finish earliest; (counts, makespan)."""
    counts = [0] * len(replicas)
    usable = [i for i, r in enumerate(replicas) if r is not None]
    if not usable:
        return counts, float("inf")
    span = {i: 0.0 for i in usable}

    def after(i: int) -> float:
        rep = replicas[i]
        assert rep is not None
        return _span(rep.stage_seconds(), counts[i] + 1)

    heap = [(after(i), i) for i in usable]  # each replica's makespan with one more micro-batch
    heapq.heapify(heap)
    for _ in range(total):
        finish, best = heapq.heappop(heap)
        span[best] = finish
        counts[best] += 1
        heapq.heappush(heap, (after(best), best))
    return counts, max(span.values())


@cache
def _span(stage_seconds: tuple[float, ...], m: int) -> float:
    """The 1F1B makespan: simulated up to 2p+2 micro-batches; past that, each one more adds the
    steady-state period, the slowest stage (the schedule converges to it from below, so this
    errs long, never short)."""
    exact = 2 * len(stage_seconds) + 2
    if m <= exact:
        return uniform_makespan(stage_seconds, m)
    return _span(stage_seconds, exact) + (m - exact) * max(stage_seconds)


def _throughput(replicas: Sequence[_Replica | None], total: int, healthy: float) -> tuple[list[int], float]:
    counts, span = assign_microbatches(replicas, total)
    return counts, (total / span) / healthy if span < float("inf") else 0.0


def _check_replan_args(layout: Layout, speeds: Sequence[float], layers: int, microbatches: int,
                       memory_factor: float) -> None:
    if len(speeds) != layout.ranks:
        raise InvalidArgument("device_speeds", f"has {len(speeds)} values; the layout has {layout.ranks} ranks")
    if any(not 0 <= v <= 1e6 for v in speeds):
        raise InvalidArgument("device_speeds", "a speed is negative or not a number (0 = dead, 1 = nominal)")
    if layout.ranks > MAX_RANKS or layout.pp > MAX_PP:
        raise InvalidArgument("layout", f"{layout.ranks} ranks, pp={layout.pp}; a re-plan takes at most "
                                        f"{MAX_RANKS} ranks and pp={MAX_PP}")
    if not layout.pp <= layers <= MAX_LAYERS:
        raise InvalidArgument("layers", f"must be pp={layout.pp}..{MAX_LAYERS} (got {layers})")
    if not 1 <= microbatches <= MAX_MICROBATCHES:
        raise InvalidArgument("microbatches", f"must be 1..{MAX_MICROBATCHES} (got {microbatches})")
    if not memory_factor >= 1:
        raise InvalidArgument("memory_factor", f"must be at least 1 (got {memory_factor})")


def replan(
    layout: Layout, speeds: Sequence[float], *, layers: int = 32, microbatches: int = 8, memory_factor: float = 2.0,
    keep_order: bool = False,
) -> Replan:
    layout = layout.base()
    _check_replan_args(layout, speeds, layers, microbatches, memory_factor)
    total = microbatches * layout.dp
    healthy_stage = [n / layout.tp for n in equal_layers(layers, layout.pp)]
    healthy = total / uniform_makespan(healthy_stage, microbatches)
    affected = {layout.replica(r) for r, v in enumerate(speeds) if v < AFFECTED_BELOW}

    before_reps = [_as_is(layout, speeds, d, layers) for d in range(layout.dp)]
    before = 0.0
    if all(r is not None for r in before_reps):  # as is: every replica keeps its share of the batch
        before = total / max(_span(r.stage_seconds(), microbatches) for r in before_reps if r is not None) / healthy
    drop_reps = [None if d in affected else _as_is(layout, speeds, d, layers) for d in range(layout.dp)]
    drop_counts, drop = _throughput(drop_reps, total, healthy)
    after_reps = [
        _replanned(layout, speeds, d, layers, memory_factor, microbatches, keep_order) if d in affected
        else _as_is(layout, speeds, d, layers)
        for d in range(layout.dp)
    ]
    counts, after = _throughput(after_reps, total, healthy)
    if drop > after:  # leaving the affected replicas out beats keeping them: do that
        after_reps, counts, after = drop_reps, drop_counts, drop
    stages: list[StagePlan] = []
    busy: set[int] = set()
    for d, rep in enumerate(after_reps):
        if rep is None or counts[d] == 0:
            continue
        for s, (g, n, v) in enumerate(zip(rep.groups, rep.layers, rep.speeds, strict=True)):
            stages.append(StagePlan(d, s, g, n, round(v, 6)))
            busy.update(g)
    idle = tuple(r for r in range(layout.ranks) if speeds[r] > 0 and r not in busy)
    return Replan(layout, tuple(stages), tuple(counts), idle, before, after, drop)


def require_accepts(job_id: str, accepts_layout_changes: bool) -> None:
    """Only a job written to take a new layout at restart may be given one."""
    if not accepts_layout_changes:
        raise FailedPrecondition(
            f"job {job_id} does not accept layout changes (accepts_layout_changes is false in its spec): "
            "a re-plan can be shown but not applied; submit the job with accepts_layout_changes: true"
        )


def layout_document(
    plan: Replan, *, layers: int, microbatches: int, speeds: Sequence[float], from_epoch: int,
) -> dict[str, object]:
    """What an applied re-plan hands the job at restart (ROTA_LAYOUT, a JSON object): the
    sizes, every stage's TP group (by original rank) and layers, each replica's
    micro-batches, the ranks left idle, and what it was planned on."""
    doc = plan.as_dict()
    sizes = doc.pop("layout")
    assert isinstance(sizes, dict)
    out = {**sizes, **doc, "layers": layers, "microbatches": microbatches,
           "device_speeds": [round(float(v), 6) for v in speeds], "from_epoch": from_epoch}
    return json.loads(json.dumps(out))  # JSON values only (lists, not tuples): it reads back equal
