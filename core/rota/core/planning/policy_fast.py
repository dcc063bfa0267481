"""The fast policy: a heuristic whose rules are the five constraints (docs/design.md §3).

1. Running jobs are pinned where they are.
2. Realtime apps get their demand, within the swap cap: a backward pass raises each step
   to what a later rise needs (ramping ahead), a forward pass keeps every fall within the
   cap. Their GPUs stack from the top of the cluster so batch blocks pack from the bottom.
3. Batch-like jobs are placed one at a time, each at the earliest step where an aligned
   block it may take (its start masks: GPU types, one switch) is free for its whole
   in-horizon duration; among those blocks a gang takes one spanning the fewest switches,
   then the one whose buddy is already partly used (best fit), so whole large blocks stay
   whole for the jobs still queued. The queue is tried in a few orders (by priority, by
   priority then size, by decayed value) and the plan with the best objective (docs/design.md §3) is kept.
4. Given the tenants' standings (the ledger's, live), each order is walked across tenants
   as `fair` walks them (`rota.core.fairness.twostage.tenant_walk`, `fair_tenant_key`):
   the tenant furthest below its share of weighted GPU-time takes its next job in that
   order, is charged a lease, and the choice repeats; so a tenant's shares count without
   `fair`'s preemptions, and within a tenant the order is kept (priority then orders a
   tenant's own jobs, not another tenant's). Without standings (one tenant waiting, no
   ledger, the benchmarks) the order is the queue's.

Every write goes through `Board`, which refuses a busy cell, so the grid is legal by
construction; the tests still run the independent checker on it.

At 8,192 GPUs x 20,000 jobs the cluster is full long before the queue is, so what keeps
this near 200 ms on two cores is proving a job has no room without searching (`_Packer`'s
failure tables, below), folding each window's free mask once for both the search and the
best fit, never writing a cell until the winning order is known (`Board` writes its
cells lazily), and trying fewer orders on long queues (`ORDERS_BY_QUEUE`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from operator import or_

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.twostage import TenantState, fair_tenant_key, tenant_walk
from rota.core.planning.constraints import StartMasks
from rota.core.planning.grid import Board, Plan, fold, highest_bits, pinned_board
from rota.core.planning.scenario import BatchJob, RealtimeApp, Scenario

OrderKey = Callable[[BatchJob], int]
# How many queue orders to try, by queue length. The two value-first orders lose by 10-30%
# on every contended --scale scenario from 1,024 GPUs x 2,000 jobs up, and the two
# priority-first ones end within 0.02% of each other there (8,192 x 20,000: 1,056,829 vs
# 1,056,965), while each order costs a full pass: long queues get fewer.
ORDERS_BY_QUEUE = ((2000, 4), (10000, 2))  # (up to this many waiting jobs, orders); else 1


def order_count(waiting: int) -> int:
    return next((n for most, n in ORDERS_BY_QUEUE if waiting <= most), 1)


def realtime_targets(r: RealtimeApp) -> list[int]:
    """GPUs to hold at each step: demand, raised early enough that the cap meets each rise.

    An app that holds GPUs now (`held`) may shed at most `max_swap` of them at step 0.
    """
    h = len(r.demand)
    need = list(r.demand)
    for t in range(h - 2, -1, -1):
        need[t] = max(need[t], need[t + 1] - r.max_swap)
    if h:
        need[0] = max(need[0], len(r.held) - r.max_swap)
    for t in range(1, h):
        need[t] = max(need[t], need[t - 1] - r.max_swap)
    return need


def place_realtime(b: Board, apps: Sequence[RealtimeApp], masks: StartMasks | None = None) -> None:
    """Each app's replicas, one GPU each, on any node (its GPU types only): it keeps what it
    holds, sheds from the nodes where it has fewest replicas first, and grows on the highest
    free GPUs. Those are on the node it runs on while that has room (an app starts at the
    top and grows down), and taking them keeps the aligned blocks below whole for batch
    jobs: preferring its own nodes anywhere cost the rolling plan of bench/fragmented a
    fifth of its value (1852 -> 1492)."""
    targets = {r.id: realtime_targets(r) for r in apps}
    allowed = {r.id: masks.rows_for(r.gpu_types) if masks else b.full for r in apps}
    per_node = masks.per_node if masks else b.gpus
    # A live app starts from the GPUs it holds (those still free: nothing else claims them).
    held = {r.id: sum(1 << g for g in set(r.held)) & ~b.busy[0] if b.horizon else 0 for r in apps}
    for t in range(b.horizon):
        # Every app keeps what it held first, so growth never takes a neighbour's GPU.
        for r in apps:
            held[r.id] = keep = keep_fullest(held[r.id], targets[r.id][t], per_node)
            b.place_mask(r.id, keep, t)
        for r in apps:
            have = held[r.id].bit_count()
            room = targets[r.id][t] - have
            if t > 0:
                room = min(room, r.max_swap)
            elif r.held:  # step 0 of a live app: the GPUs it shed already count as moves
                room = min(room, r.max_swap - (len(r.held) - have))
            take = highest_bits((b.full ^ b.busy[t]) & allowed[r.id], room)  # the highest free GPUs
            b.place_mask(r.id, take, t)
            held[r.id] |= take


def keep_fullest(held: int, k: int, per_node: int) -> int:
    """k of the GPUs in `held`: the nodes (slots of `per_node` rows) with the most of them
    first, each node's highest; a shrinking app empties its emptiest nodes first."""
    if held.bit_count() <= k:
        return held
    block = (1 << per_node) - 1
    slots = [(held >> (i * per_node) & block, i) for i in range(-(-held.bit_length() // per_node))]
    out = 0
    for bits, i in sorted(slots, key=lambda x: (x[0].bit_count(), x[1]), reverse=True):
        if k <= 0:
            break
        part = highest_bits(bits, k)
        out |= part << (i * per_node)
        k -= part.bit_count()
    return out


def _best_fit(b: Board, free: int, starts: int, size: int, tiers: Sequence[int] = ()) -> int:
    """Among aligned free blocks (bits of `starts`), one spanning the fewest switches
    (`tiers`: start masks by switches spanned), then the one in the most-used buddy.

    `free` is the window's free mask folded to `size`; folding it once more per level
    gives the buddies still entirely free, without recomputing the window."""
    for tier in tiers if len(tiers) > 1 else ():
        if starts & tier:
            starts &= tier
            break
    align = b._align
    level, whole = size * 2, free
    while level <= b.gpus:
        whole &= whole >> (level // 2)
        buddies = whole & align[level]  # buddies of `level` still entirely free
        if not buddies:  # no whole buddy: every start is already in a used one
            break
        spread, k = buddies, size
        while k < level:  # mark every child block of a whole buddy
            spread |= spread << k
            k *= 2
        tight = (starts | spread) ^ spread  # starts & ~spread, without a negative big int
        if tight:
            return (tight & -tight).bit_length() - 1
        level *= 2
    return (starts & -starts).bit_length() - 1


def search(
    b: Board, size: int, duration: int, arrival: int, allowed: int, tiers: Sequence[int],
    dead: Sequence[list[int]] = (), free: list[int] | None = None,
) -> tuple[int, int] | None:
    """(start, first GPU) of the earliest allowed aligned block free for the in-horizon run.

    `dead[0][t]` (when given) is the shortest window from step t known to hold no allowed
    block of this size; a failed window is recorded there and in the tables of the larger
    sizes (`dead[1:]`: a block of 2n holds two of n). `free` is the free GPUs per step."""
    h, busy, full = b.horizon, b.busy, b.full
    first_dead = dead[0] if dead else None
    for t in range(arrival, h):
        n = duration if t + duration <= h else h - t
        if first_dead is not None and n >= first_dead[t]:
            continue
        if free is None or min(free[t : t + n]) >= size:
            x = fold(full ^ reduce(or_, busy[t : t + n]), size)  # ^: busy lies within full
            starts = x & allowed
            if starts:
                return t, _best_fit(b, x, starts, size, tiers)
        for table in dead:
            if n < table[t]:
                table[t] = n
    return None


def earliest_block(b: Board, j: BatchJob, not_before: int, masks: StartMasks | None = None) -> tuple[int, int] | None:
    """(start, first GPU) of the earliest aligned block free for j's whole in-horizon run,
    among the starts `masks` allows j (any aligned start without masks)."""
    allowed = masks.allowed(j) if masks else b._align[j.gpus]
    tiers = masks.span_tiers(j.gpus) if masks else ()
    return search(b, j.gpus, j.duration, max(not_before, j.arrival), allowed, tiers)


# A queued job as the packer reads it: the job, its table slot (class x size), arrival
# and in-horizon run (clamped to the horizon), and its allowed starts and switch tiers.
_Entry = tuple[BatchJob, int, int, int, int, tuple[int, ...]]


class Queue:
    """The waiting jobs with what every order's pass needs of them, computed once.

    A job's class is its placement constraints (GPU types, one switch): jobs of a class and
    size may take the same starts, so one failure speaks for all of them. `slot` numbers
    (class, size); `larger[slot]` lists the slots of its class and its size or larger.
    """

    def __init__(self, s: Scenario, jobs: Sequence[BatchJob], masks: StartMasks) -> None:
        h = s.horizon
        levels = max((j.gpus for j in jobs), default=1).bit_length()  # sizes 1, 2, 4, ...
        slots: dict[tuple[frozenset[str], bool, int], tuple[int, int, tuple[int, ...]]] = {}
        classes: dict[tuple[frozenset[str], bool], int] = {}
        self.entries: list[_Entry] = []  # in the order of `jobs`
        for j in jobs:
            key = (j.gpu_types, j.same_switch, j.gpus)
            if key not in slots:
                c = classes.setdefault(key[:2], len(classes))
                slots[key] = (c * levels + j.gpus.bit_length() - 1, masks.allowed(j), masks.span_tiers(j.gpus))
            slot, allowed, tiers = slots[key]
            self.entries.append((j, slot, j.arrival if j.arrival < h else h, j.duration if j.duration < h else h,
                                 allowed, tiers))
        self.slots = len(classes) * levels
        self.larger = [list(range(i, i - i % levels + levels)) for i in range(self.slots)]


class _Packer:
    """One pass of the queue over a board, with what it learns about failures.

    The board only fills as jobs are placed, so a window that held no allowed block of n
    GPUs never will, nor one of 2n: `dead` keeps, per slot (class x size) and start step,
    the shortest such window, and the search skips those starts. A job whose whole search
    failed rules out every later one of its slot (or a larger size) needing as much (no
    earlier arrival, no longer run): `no_room[slot][a]` keeps the shortest failed run among
    arrivals up to a, so with thousands queued on a full cluster most of the queue is
    settled by one comparison.
    """

    def __init__(self, b: Board, s: Scenario, q: Queue) -> None:
        self.b, self.h = b, s.horizon
        self.w = [s.decay**t for t in range(s.horizon)]
        self.free = [b.free_count(t) for t in range(s.horizon)]
        dead = [[self.h + 1] * self.h for _ in range(q.slots)]
        self.no_room = [[self.h + 1] * (self.h + 1) for _ in range(q.slots)]
        # Per slot, its tables and those of the larger sizes: what a failure is written to.
        self.dead_from = [[dead[i] for i in up] for up in q.larger]
        self.no_room_from = [[self.no_room[i] for i in up] for up in q.larger]
        self.placed: dict[str, tuple[int, int]] = {}  # job -> (start, first GPU)

    def place(self, order: Sequence[_Entry]) -> float:
        b, h, w, free, no_room = self.b, self.h, self.w, self.free, self.no_room
        earned = 0.0
        for j, slot, arrival, need, allowed, tiers in order:
            if need >= no_room[slot][arrival]:
                continue
            spot = search(b, j.gpus, j.duration, arrival, allowed, tiers, self.dead_from[slot], free) if allowed else None
            if spot is None:
                for table in self.no_room_from[slot]:
                    for a in range(arrival, h + 1):
                        if need < table[a]:
                            table[a] = need
                continue
            start, first = spot
            end = start + j.duration if start + j.duration < h else h
            b.place_block(j.id, first, j.gpus, start, end)
            self.placed[j.id] = spot
            for t in range(start, end):
                free[t] -= j.gpus
            earned += j.priority * j.gpus * sum(w[start:end])
        return earned


def place_batch(b: Board, s: Scenario, queue: Sequence[BatchJob], masks: StartMasks | None = None) -> float:
    """Place the queue in order; returns the decayed value it earned (the objective's part)."""
    q = Queue(s, queue, masks or StartMasks(s))
    return _Packer(b, s, q).place(q.entries)


def orders(s: Scenario) -> list[OrderKey]:
    """The queue orders tried, each a lexicographic key packed into one int (every field
    offset to be non-negative and below its base): sorting 20,000 jobs then compares
    small ints, not tuples.

    0: priority, arrival, size (largest first), duration (longest first);
    1: priority, size, arrival, duration; 2: decayed value if started on arrival, arrival;
    3: size, priority, arrival.
    """
    h, g = s.horizon, s.gpus
    arr, size, dur = h + 1, g + 1, max((j.duration for j in s.batch), default=0) + 1
    p = max((j.priority for j in s.batch), default=10)
    top = p * g * h + 1  # above any priority x GPUs x in-horizon steps

    def reach(j: BatchJob) -> int:  # in-horizon steps if it started on arrival
        return max(0, min(j.duration, h - j.arrival))

    return [
        lambda j: (((p - j.priority) * arr + j.arrival) * size + g - j.gpus) * dur + dur - 1 - j.duration,
        lambda j: (((p - j.priority) * size + g - j.gpus) * arr + j.arrival) * dur + dur - 1 - j.duration,
        lambda j: (top - j.priority * j.gpus * reach(j)) * arr + j.arrival,
        lambda j: ((g - j.gpus) * (p + 1) + p - j.priority) * arr + j.arrival,
    ]


@dataclass
class Packed:
    """Fast's grid as placements: what an improver (full_search) starts from."""

    base: Board  # the pinned jobs and the realtime apps only
    board: Board  # base plus the batch-like jobs placed
    placed: dict[str, tuple[int, int]]  # waiting job -> (start, first GPU)
    order: int  # which of `orders` won


def share_walk(packer: _Packer, order: Sequence[_Entry], standings: Mapping[str, TenantState],
               cfg: FairnessConfig) -> float:
    """Place `order` tenant by tenant in standing order (`fair`'s stage 1), each tenant's
    jobs in `order`; a tenant unknown to the standings has no quota (served last)."""
    entry = {e[0].id: e for e in order}
    queues: dict[str, list[BatchJob]] = {}
    for e in order:
        queues.setdefault(e[0].tenant, []).append(e[0])
    tenants = {t: dataclasses.replace(standings[t]) if t in standings else TenantState(t, 0, 0, 0.0, 0.0)
               for t in queues}  # copies: the walk charges each pick to its tenant
    earned = 0.0

    def place(j: BatchJob) -> bool:
        nonlocal earned
        earned += packer.place([entry[j.id]])
        return j.id in packer.placed

    tenant_walk(tenants, queues.__getitem__, lambda t: fair_tenant_key(t, cfg), place, cfg.lease_s)
    return earned


def pack(s: Scenario, masks: StartMasks | None = None, standings: Mapping[str, TenantState] | None = None,
         cfg: FairnessConfig | None = None) -> Packed:
    masks = masks or StartMasks(s)
    base = pinned_board(s)
    place_realtime(base, s.realtime, masks)
    waiting = [j for j in s.batch if j.running is None and j.arrival < s.horizon]
    q = Queue(s, waiting, masks)
    shared = standings is not None and len({j.tenant for j in waiting}) > 1
    best: tuple[float, int, _Packer] | None = None
    for i, key in enumerate(orders(s)[: order_count(len(waiting))]):
        rank = [key(j) for j in waiting]
        packer = _Packer(base.copy(), s, q)
        order = [q.entries[k] for k in sorted(range(len(waiting)), key=rank.__getitem__)]
        if shared and standings is not None:
            earned = share_walk(packer, order, standings, cfg or FairnessConfig())
        else:
            earned = packer.place(order)
        if best is None or earned > best[0]:
            best = (earned, i, packer)
    assert best is not None
    return Packed(base, best[2].b, best[2].placed, best[1])


def plan(s: Scenario, masks: StartMasks | None = None, standings: Mapping[str, TenantState] | None = None,
         cfg: FairnessConfig | None = None) -> Plan:
    """Fast's grid; `standings` (per tenant: quota, held GPUs, U and W, as `fair` reads
    them) interleave the queue across tenants by their standing."""
    packed = pack(s, masks, standings, cfg)
    return Plan(packed.board.cells, {"order": packed.order})
