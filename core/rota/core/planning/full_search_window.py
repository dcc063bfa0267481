"""One window of the large-neighbourhood search (full_search): the sub-problem, what an
answer to it earns, and the greedy re-fill tried on it before CP-SAT (policy_full) is.

A window is a block of aligned GPU rows x the whole horizon. What stays in it (pinned
jobs, realtime apps, jobs too big to free) is its `busy` masks; the jobs offered to it are
those freed from it, some fast left unplaced, and some placed elsewhere that could start
earlier here. An answer names where each job it places starts; the rest are dropped (if
freed) or stay where they are (if placed elsewhere).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rota.core.planning.grid import Board
from rota.core.planning.policy_fast import search
from rota.core.planning.scenario import BatchJob

GREEDY_ORDERS = 8  # seeded orders a window is re-filled in before it counts as tried


@dataclass(frozen=True)
class WindowJob:
    id: str
    gpus: int
    duration: int
    arrival: int
    priority: int
    allowed: int  # bit f: it may take the block at row f, relative to the window's first row
    hint: tuple[int, int] | None  # (start, relative first GPU) in the window now, if it is
    stay: float = 0.0  # what it earns where it is now, outside the window (0: unplaced)

    @property
    def starts(self) -> list[int]:
        return [f for f in range(0, self.allowed.bit_length(), self.gpus) if self.allowed >> f & 1]


@dataclass(frozen=True)
class Window:
    """A sub-problem: place some of `jobs` in rows [first, first + rows) x steps [0, horizon)
    around what stays (`busy[t]`: the window's rows held at step t, bit 0 = row `first`)."""

    first: int
    rows: int
    horizon: int
    weights: tuple[float, ...]
    busy: tuple[int, ...]
    jobs: tuple[WindowJob, ...]

    def earned(self, answer: dict[str, tuple[int, int]]) -> float:
        """What an answer earns over the window's jobs as they are now."""
        offered = {j.id: j for j in self.jobs}
        before = sum(value(j, j.hint[0], self.weights) for j in self.jobs if j.hint is not None)
        after = sum(value(offered[i], start, self.weights) - offered[i].stay for i, (start, _) in answer.items())
        return after - before


# (window, deterministic seconds, wall seconds left, seed) -> {job: (start, relative first)}
# for the jobs it places, or None when it found no solution.
Solve = Callable[[Window, float, float, int], dict[str, tuple[int, int]] | None]


def value(j: BatchJob | WindowJob, start: int, weights: Sequence[float]) -> float:
    """The decayed value j earns if it starts at `start` (its in-horizon GPU-steps)."""
    return j.priority * j.gpus * sum(weights[start : start + j.duration])


def recreate(win: Window, rng: random.Random, tries: int = GREEDY_ORDERS) -> dict[str, tuple[int, int]] | None:
    """The window re-filled by fast's block search, its jobs in priority order and then in
    `tries - 1` seeded noisy ones; the best answer that earns more than now, or None.

    A mover is placed only where it earns more than it does now."""
    best, best_gain = None, 1e-6
    for k in range(tries):
        if k == 0:
            order = sorted(win.jobs, key=lambda j: (-j.priority, -j.gpus, j.arrival))
        else:
            noise = {j.id: -j.priority * rng.uniform(0.3, 1.7) for j in win.jobs}
            order = sorted(win.jobs, key=lambda j: noise[j.id])
        b = Board(win.rows, win.horizon)
        b.busy = list(win.busy)
        free = [b.free_count(t) for t in range(win.horizon)]
        # Per (size, allowed starts): the shortest window from each step known to hold no
        # block (fast's `dead` tables: the window only fills, so a failure stays one).
        dead: dict[tuple[int, int], list[list[int]]] = {}
        answer: dict[str, tuple[int, int]] = {}
        for j in order:
            if not j.allowed:
                continue
            tables = dead.setdefault((j.gpus, j.allowed), [[win.horizon + 1] * win.horizon])
            spot = search(b, j.gpus, j.duration, j.arrival, j.allowed, (), tables, free)
            if spot is None or value(j, spot[0], win.weights) <= j.stay + 1e-9:
                continue
            b.place_block(j.id, spot[1], j.gpus, spot[0], spot[0] + j.duration)
            for t in range(spot[0], min(spot[0] + j.duration, win.horizon)):
                free[t] -= j.gpus
            answer[j.id] = spot
        gain = win.earned(answer)
        if gain > best_gain:
            best, best_gain = answer, gain
    return best
