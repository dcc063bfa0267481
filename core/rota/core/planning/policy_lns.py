"""Large-neighbourhood search over the fast grid: how `full` improves plans past a few nodes.

The whole CP-SAT model (policy_full) stops proving or improving anything beyond 8-16 GPUs:
it is hinted with fast's grid and runs out of time before it gets past it. This search
keeps fast's grid and re-solves small pieces of it exactly, one at a time:

1. a window of aligned GPU rows (16, 32 or 64 of them) x the horizon is picked, seeded-
   randomly, weighted to where GPU-steps lie idle;
2. the waiting jobs placed inside it are freed, and joined by a few of the jobs fast left
   unplaced that may run there (highest priority first, at most two alike);
3. that sub-problem - everything outside the window, the pinned jobs and the realtime
   apps fixed - is solved by the `solve` callback (CP-SAT, in policy_full, hinted with
   the current placement), and its answer is kept only if it earns more.

Realtime apps keep fast's allocation, so the result is always at least fast's objective.
The search is pure and deterministic given its seed: windows and candidates come from a
seeded generator and each solve is bounded by deterministic time; only the wall-clock
limit decides how many iterations run (`iterations` fixes the count instead).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from rota.core.planning.constraints import StartMasks
from rota.core.planning.grid import Board
from rota.core.planning.policy_fast import Packed
from rota.core.planning.scenario import BatchJob, Scenario

WINDOW_ROWS = (16, 32, 64)  # tried in turn; each no larger than the cluster
MAX_CANDIDATES = 24  # unplaced jobs offered to one window
ALIKE = 2  # at most this many unplaced jobs of one (size, run, priority, arrival, class)
SOLVE_DETERMINISTIC_S = 0.4  # CP-SAT's deterministic time per window


@dataclass(frozen=True)
class WindowJob:
    id: str
    gpus: int
    duration: int
    arrival: int
    priority: int
    starts: tuple[int, ...]  # first GPUs it may take, relative to the window's first row
    hint: tuple[int, int] | None  # (start, relative first GPU) where it is now; None: unplaced


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


# (window, deterministic seconds, wall seconds left, seed) -> {job: (start, relative first)}
# for the jobs it places, or None when it found no solution.
Solve = Callable[[Window, float, float, int], dict[str, tuple[int, int]] | None]


def value(j: BatchJob | WindowJob, start: int, weights: tuple[float, ...]) -> float:
    """The decayed value j earns if it starts at `start` (its in-horizon GPU-steps)."""
    return j.priority * j.gpus * sum(weights[start : start + j.duration])


class Search:
    def __init__(self, s: Scenario, packed: Packed, masks: StartMasks, seed: int) -> None:
        self.s, self.masks, self.rng = s, masks, random.Random(seed)
        self.w = tuple(s.decay**t for t in range(s.horizon))
        self.base = packed.base
        self.busy = packed.board.busy[:]
        self.placed = dict(packed.placed)
        self.jobs = {j.id: j for j in s.batch if j.running is None and j.arrival < s.horizon}
        # Unplaced jobs in the order they are offered: priority first, ties shuffled once.
        pool = [j for j in self.jobs.values() if j.id not in self.placed]
        keys = {j.id: (-j.priority, self.rng.random()) for j in pool}
        self.pool = sorted(pool, key=lambda j: keys[j.id])
        self.gain = 0.0
        self.tried = self.improved = 0
        # Windows solved without gain since the last change anywhere: not worth a retry.
        self.stale: set[tuple[int, int]] = set()

    def window(self, rows: int) -> tuple[int, int] | None:
        """An aligned window of `rows` rows, weighted by its idle GPU-steps (+1)."""
        s = self.s
        want = (1 << rows) - 1
        choices, weights = [], []
        for first in range(0, s.gpus, rows):
            if (first, rows) in self.stale:
                continue
            idle = sum(rows - (b >> first & want).bit_count() for b in self.busy)
            choices.append((first, rows))
            weights.append(idle + 1)
        return self.rng.choices(choices, weights)[0] if choices else None

    def sub_problem(self, first: int, rows: int) -> Window:
        s, want = self.s, ((1 << rows) - 1) << first
        freed = [self.jobs[i] for i, (_, f) in self.placed.items() if first <= f and f + self.jobs[i].gpus <= first + rows]
        busy = [b & want for b in self.busy]
        for j in freed:
            start, f = self.placed[j.id]
            bits = ((1 << j.gpus) - 1) << f
            for t in range(start, min(start + j.duration, s.horizon)):
                busy[t] &= ~bits
        jobs = [self._window_job(j, first, rows, self.placed[j.id]) for j in freed]
        alike: dict[tuple[int, int, int, int, frozenset[str], bool], int] = {}
        for j in self.pool:
            if len(jobs) >= len(freed) + MAX_CANDIDATES:
                break
            if j.gpus > rows or not self.masks.allowed(j) & want:
                continue
            key = (j.gpus, min(j.duration, s.horizon - j.arrival), j.priority, j.arrival, j.gpu_types, j.same_switch)
            alike[key] = alike.get(key, 0) + 1
            if alike[key] <= ALIKE:
                jobs.append(self._window_job(j, first, rows, None))
        return Window(first, rows, s.horizon, self.w, tuple(b >> first for b in busy), tuple(jobs))

    def _window_job(self, j: BatchJob, first: int, rows: int, at: tuple[int, int] | None) -> WindowJob:
        allowed = self.masks.allowed(j) >> first & ((1 << rows) - 1)
        starts = tuple(f for f in range(0, rows, j.gpus) if allowed >> f & 1)
        hint = None if at is None else (at[0], at[1] - first)
        return WindowJob(j.id, j.gpus, j.duration, j.arrival, j.priority, starts, hint)

    def accept(self, win: Window, answer: dict[str, tuple[int, int]]) -> bool:
        """Keep the window's new placement if it earns more; every block is checked to be
        one of the job's allowed starts, after its arrival and free, before it is kept."""
        before = sum(value(j, j.hint[0], self.w) for j in win.jobs if j.hint is not None)
        after = sum(value(self.jobs[i], start, self.w) for i, (start, _) in answer.items())
        if after <= before + 1e-6:
            return False
        offered = {wj.id: wj for wj in win.jobs}
        busy = list(win.busy)
        for i, (start, f) in answer.items():
            wj = offered[i]
            assert f in wj.starts and wj.arrival <= start < win.horizon, f"{i}: block {f} at {start} not allowed"
            bits = ((1 << wj.gpus) - 1) << f
            for t in range(start, min(start + wj.duration, win.horizon)):
                assert not busy[t] & bits, f"{i}: block {f}+{wj.gpus} taken at step {t}"
                busy[t] |= bits
        want = ((1 << win.rows) - 1) << win.first
        self.busy = [(b & ~want) | (mine << win.first) for b, mine in zip(self.busy, busy, strict=True)]
        for i in offered:
            self.placed.pop(i, None)
        for i, (start, f) in answer.items():
            self.placed[i] = (start, f + win.first)
        dropped = [self.jobs[i] for i, wj in offered.items() if wj.hint is not None and i not in answer]
        self.pool = [j for j in self.pool if j.id not in answer]
        self.pool.extend(dropped)  # out of the window: offered again, after the rest
        self.gain += after - before
        self.stale.clear()
        return True

    def board(self) -> Board:
        """The current placement on a fresh copy of the pinned-and-realtime board."""
        b = self.base.copy()
        for i, (start, first) in sorted(self.placed.items(), key=lambda x: x[1]):
            j = self.jobs[i]
            b.place_block(i, first, j.gpus, start, start + j.duration)
        return b


def improve(
    s: Scenario, packed: Packed, solve: Solve, time_limit: float, seed: int = 0,
    iterations: int | None = None, started: float | None = None, masks: StartMasks | None = None,
) -> tuple[Board, dict[str, float | int | str]]:
    """Fast's placement improved window by window until `time_limit` seconds have passed
    since `started` (or `iterations` windows were tried); returns the board and stats."""
    started = time.perf_counter() if started is None else started
    search = Search(s, packed, masks or StartMasks(s), seed)
    sizes = [r for r in WINDOW_ROWS if r <= s.gpus] or [s.gpus]
    while iterations is None or search.tried < iterations:
        left = time_limit - (time.perf_counter() - started)
        if left <= 0.05:
            break
        rows = sizes[search.tried % len(sizes)]
        spot = search.window(rows)
        search.tried += 1
        if spot is None:
            if all(search.window(r) is None for r in sizes):
                break  # every window is solved as well as it can be
            continue
        win = search.sub_problem(*spot)
        answer = solve(win, SOLVE_DETERMINISTIC_S, left, seed + search.tried)
        if answer is not None and search.accept(win, answer):
            search.improved += 1
        else:
            search.stale.add(spot)
    stats: dict[str, float | int | str] = {"windows": search.tried, "improved": search.improved,
                                          "lns_gain": round(search.gain, 3)}
    return search.board(), stats
