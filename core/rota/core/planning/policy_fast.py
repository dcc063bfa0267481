"""The fast policy: a heuristic whose rules are the five constraints (SPEC §3).

1. Running jobs are pinned where they are.
2. Realtime apps get their demand, within the swap cap: a backward pass raises each step
   to what a later rise needs (ramping ahead), a forward pass keeps every fall within the
   cap. Their GPUs stack from the top of the cluster so batch blocks pack from the bottom.
3. Batch-like jobs are placed one at a time, each at the earliest step where an aligned
   block is free for its whole in-horizon duration; among those blocks it takes the one
   whose buddy is already partly used (best fit), so whole large blocks stay whole for the
   jobs still queued. The queue is tried in a few orders (by priority, by priority then
   size, by decayed value) and the plan with the best SPEC objective is kept.

Every write goes through `Board`, which refuses a busy cell, so the grid is legal by
construction; the tests still run the independent checker on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rota.core.planning.grid import Board, Plan, pinned_board
from rota.core.planning.scenario import BatchJob, RealtimeApp, Scenario

OrderKey = Callable[[BatchJob], tuple[float, ...]]


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


def place_realtime(b: Board, apps: Sequence[RealtimeApp]) -> None:
    targets = {r.id: realtime_targets(r) for r in apps}
    # A live app starts from the GPUs it holds (those still free: nothing else claims them).
    held = {r.id: [g for g in r.held if b.horizon and not b.busy[0] >> g & 1] for r in apps}
    for t in range(b.horizon):
        # Every app keeps what it held first, so growth never takes a neighbour's GPU.
        for r in apps:
            keep = sorted(held[r.id], reverse=True)[: targets[r.id][t]]  # drop the lowest GPUs
            held[r.id] = keep
            for g in keep:
                b.place_cell(r.id, g, t)
        for r in apps:
            room = targets[r.id][t] - len(held[r.id])
            if t > 0:
                room = min(room, r.max_swap)
            elif r.held:  # step 0 of a live app: the GPUs it shed already count as moves
                room = min(room, r.max_swap - (len(r.held) - len(held[r.id])))
            free = b.full & ~b.busy[t]
            while room > 0 and free:
                g = free.bit_length() - 1  # the highest free GPU
                free &= ~(1 << g)
                b.place_cell(r.id, g, t)
                held[r.id].append(g)
                room -= 1


def _best_fit(b: Board, starts: int, size: int, t0: int, t1: int) -> int:
    """Among aligned free blocks (bits of `starts`), the one in the most-used buddy."""
    level = size * 2
    while level <= b.gpus:
        whole = b.aligned_starts(level, t0, t1)  # buddies of `level` still entirely free
        spread, k = whole, size
        while k < level:  # mark every child block of a whole buddy
            spread |= spread << k
            k *= 2
        tight = starts & ~spread
        if tight:
            return (tight & -tight).bit_length() - 1
        level *= 2
    return (starts & -starts).bit_length() - 1


def earliest_block(b: Board, j: BatchJob, not_before: int) -> tuple[int, int] | None:
    """(start, first GPU) of the earliest aligned block free for j's whole in-horizon run."""
    for start in range(max(not_before, j.arrival), b.horizon):
        end = min(start + j.duration, b.horizon)
        starts = b.aligned_starts(j.gpus, start, end)
        if starts:
            return start, _best_fit(b, starts, j.gpus, start, end)
    return None


def place_batch(b: Board, s: Scenario, queue: Sequence[BatchJob]) -> float:
    """Place the queue in order; returns the decayed value it earned (the objective's part).

    The board only fills as jobs are placed, so a job that found no block rules out every
    later one of its size needing as much (no earlier arrival, no shorter run): with
    thousands queued on a full cluster, most of the queue is settled without a search.
    """
    w = [s.decay**t for t in range(s.horizon)]
    earned = 0.0
    no_room: dict[int, list[tuple[int, int]]] = {}  # GPUs -> (arrival, in-horizon steps) that failed
    for j in queue:
        need = (j.arrival, min(j.duration, s.horizon))
        if any(need[0] >= a and need[1] >= d for a, d in no_room.get(j.gpus, ())):
            continue
        spot = earliest_block(b, j, 0)
        if spot is None:
            no_room.setdefault(j.gpus, []).append(need)
            continue
        start, first = spot
        b.place_block(j.id, first, j.gpus, start, start + j.duration)
        earned += j.priority * j.gpus * sum(w[start : start + j.duration])
    return earned


def orders(s: Scenario) -> list[OrderKey]:
    h = s.horizon

    def reach(j: BatchJob) -> int:  # in-horizon steps if it started on arrival
        return max(0, min(j.duration, h - j.arrival))

    return [
        lambda j: (-j.priority, j.arrival, -j.gpus, -j.duration),
        lambda j: (-j.priority, -j.gpus, j.arrival, -j.duration),
        lambda j: (-j.priority * j.gpus * reach(j), j.arrival),
        lambda j: (-j.gpus, -j.priority, j.arrival),
    ]


def plan(s: Scenario) -> Plan:
    base = pinned_board(s)
    place_realtime(base, s.realtime)
    waiting = [j for j in s.batch if j.running is None and j.arrival < s.horizon]
    best: tuple[float, Board] | None = None
    for key in orders(s):
        b = base.copy()
        earned = place_batch(b, s, sorted(waiting, key=key))
        if best is None or earned > best[0]:
            best = (earned, b)
    assert best is not None
    return Plan(best[1].cells)
