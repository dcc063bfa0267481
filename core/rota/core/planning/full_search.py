"""Large-neighbourhood search over the fast grid: how `full` improves plans past a few nodes.

The whole CP-SAT model (policy_full) stops proving or improving anything beyond 8-16 GPUs:
it is hinted with fast's grid and runs out of time before it gets past it. This search
keeps fast's grid and re-solves small pieces of it, one at a time:

1. a window of aligned GPU rows x the horizon is picked, seeded-randomly, weighted to
   where GPU-steps lie idle;
2. the waiting jobs placed inside it are freed, and joined by some of the jobs fast left
   unplaced that may run there (highest priority first, at most two alike) and by some
   placed elsewhere after their arrival that could start earlier here ("movers");
3. that sub-problem - everything outside the window, the pinned jobs and the realtime
   apps fixed - is re-solved, and the answer kept only if it earns more.

Each window is first re-filled greedily (full_search_window.recreate: fast's own block search on
the window, in a few seeded orders; thousands per second), and once no window gains that way,
solved exactly by the `solve` callback (CP-SAT, in policy_full, hinted with the current
placement) for what the greedy orders miss; an exact gain makes every window worth a
greedy try again. Realtime apps keep fast's allocation, so the result never falls below
fast's objective. The search is pure and deterministic given its seed: windows, orders
and candidates come from a seeded generator and each solve is bounded by deterministic
time; only the wall-clock limit decides how many windows are tried (`iterations` fixes
the count instead).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

from rota.core.planning.constraints import StartMasks
from rota.core.planning.full_search_window import Solve, Window, WindowJob, recreate, value
from rota.core.planning.grid import Board
from rota.core.planning.policy_fast import Packed
from rota.core.planning.scenario import BatchJob, Scenario

GREEDY_ROWS = (16, 32, 64, 128, 256)  # window heights tried in turn (no larger than the cluster)
EXACT_ROWS = (16, 32, 64)  # CP-SAT's: past 64 rows a window is rarely solved in its time
ALIKE = 2  # at most this many unplaced jobs of one (size, run, priority, arrival, class)
SOLVE_DETERMINISTIC_S = 0.05  # CP-SAT's deterministic time per window (~0.2-1 s on 2 cores)
EXACT_MIN_S = 0.2  # no exact window is started with less time than this left
# Tries without gain after which a window is left alone until something changes: a greedy
# retry costs milliseconds and samples other candidates; an exact one would repeat itself.
RETRIES = {"greedy": 4, "exact": 1}


def candidates(rows: int) -> int:
    """Unplaced jobs offered to a window of `rows` rows (as many movers, halved)."""
    return max(16, rows // 2)


class Search:
    """The placement being improved, with what picking a window needs kept up to date."""

    def __init__(self, s: Scenario, packed: Packed, masks: StartMasks, seed: int) -> None:
        self.s, self.masks, self.rng = s, masks, random.Random(seed)
        self.w = tuple(s.decay**t for t in range(s.horizon))
        self.base = packed.base
        self.busy = packed.board.busy[:]
        self.jobs = {j.id: j for j in s.batch if j.running is None and j.arrival < s.horizon}
        self.placed: dict[str, tuple[int, int]] = {}
        self.at_row: dict[int, set[str]] = {}  # first GPU -> jobs placed there
        for i, spot in packed.placed.items():
            self._put(i, spot)
        # Unplaced jobs in the order they are offered: priority first, ties shuffled once.
        pool = [j for j in self.jobs.values() if j.id not in self.placed]
        keys = {j.id: (-j.priority, self.rng.random()) for j in pool}
        self.pool = sorted(pool, key=lambda j: keys[j.id])
        self._late()
        self.idle: dict[int, list[int]] = {}  # rows -> idle GPU-steps of each window
        self.gain = 0.0
        self.tried = self.improved = 0
        # Per method, how often each window was re-solved without gain since the last change:
        # at RETRIES[method] it is stale, not worth another try.
        self.failed: dict[str, dict[tuple[int, int], int]] = {"greedy": {}, "exact": {}}

    def _put(self, i: str, spot: tuple[int, int]) -> None:
        self.placed[i] = spot
        self.at_row.setdefault(spot[1], set()).add(i)

    def _drop(self, i: str) -> None:
        self.at_row[self.placed.pop(i)[1]].discard(i)

    def _late(self) -> None:
        """Placed jobs that started after their arrival, most to gain by moving first."""
        late = []
        for i, (start, _) in self.placed.items():
            j = self.jobs[i]
            if start > j.arrival:
                late.append((value(j, start, self.w) - value(j, j.arrival, self.w), i))
        self.late = [i for _, i in sorted(late)]

    def _idle(self, rows: int, first: int) -> int:
        want = (1 << rows) - 1
        return sum(rows - (b >> first & want).bit_count() for b in self.busy)

    def window(self, rows: int, method: str) -> tuple[int, int] | None:
        """An aligned window of `rows` rows not yet stale for `method`, weighted by its idle
        GPU-steps (+1: a full window may still swap a job for a better one) over the square
        of its failed tries (+1), so fresh windows go first."""
        if rows not in self.idle:
            self.idle[rows] = [self._idle(rows, f) for f in range(0, self.s.gpus, rows)]
        failed, most = self.failed[method], RETRIES[method]
        choices = [(k * rows, rows) for k in range(len(self.idle[rows])) if failed.get((k * rows, rows), 0) < most]
        if not choices:
            return None
        return self.rng.choices(choices, [(self.idle[rows][f // rows] + 1) / (1 + failed.get((f, rows), 0)) ** 2
                                          for f, _ in choices])[0]

    def sub_problem(self, first: int, rows: int, attempt: int = 0) -> Window:
        """The window's sub-problem. A first attempt is offered the best candidates (highest
        priority, most to gain by moving); a retry a seeded sample of the next best."""
        s, want = self.s, ((1 << rows) - 1) << first
        freed = [i for g in range(first, first + rows) for i in sorted(self.at_row.get(g, ()))
                 if g + self.jobs[i].gpus <= first + rows]
        busy = [b & want for b in self.busy]
        for i in freed:
            start, f = self.placed[i]
            bits = ((1 << self.jobs[i].gpus) - 1) << f
            for t in range(start, min(start + self.jobs[i].duration, s.horizon)):
                busy[t] ^= bits  # it held these: clear them
        jobs = [self._window_job(self.jobs[i], first, rows, self.placed[i]) for i in freed]
        spread = 1 if attempt == 0 else 4  # a retry samples from this many times the offer
        unplaced = self._unplaced_offer(rows, want, spread * candidates(rows))
        late = self._late_offer(first, rows, want, spread * candidates(rows) // 2)
        if attempt:
            unplaced = self.rng.sample(unplaced, min(len(unplaced), candidates(rows)))
            late = self.rng.sample(late, min(len(late), candidates(rows) // 2))
        jobs += [self._window_job(j, first, rows, None) for j in unplaced]
        jobs += [replace(self._window_job(self.jobs[i], first, rows, None), stay=value(self.jobs[i], self.placed[i][0], self.w))
                 for i in late]
        return Window(first, rows, s.horizon, self.w, tuple(b >> first for b in busy), tuple(jobs))

    def _unplaced_offer(self, rows: int, want: int, most: int) -> list[BatchJob]:
        """Up to `most` waiting jobs that fit the window, at most ALIKE of each kind."""
        s = self.s
        alike: dict[tuple[int, int, int, int, frozenset[str], bool], int] = {}
        unplaced: list[BatchJob] = []
        for j in self.pool:
            if len(unplaced) >= most:
                break
            if j.gpus > rows or not self.masks.allowed(j) & want:
                continue
            key = (j.gpus, min(j.duration, s.horizon - j.arrival), j.priority, j.arrival, j.gpu_types, j.same_switch)
            alike[key] = alike.get(key, 0) + 1
            if alike[key] <= ALIKE:
                unplaced.append(j)
        return unplaced

    def _late_offer(self, first: int, rows: int, want: int, most: int) -> list[str]:
        """Up to `most` late jobs placed outside the window that it could take."""
        late: list[str] = []
        for i in self.late:
            if len(late) >= most:
                break
            j, f = self.jobs[i], self.placed[i][1]
            if j.gpus <= rows and not first <= f < first + rows and self.masks.allowed(j) & want:
                late.append(i)
        return late

    def _window_job(self, j: BatchJob, first: int, rows: int, at: tuple[int, int] | None) -> WindowJob:
        allowed = self.masks.allowed(j) >> first & ((1 << rows) - 1)
        hint = None if at is None else (at[0], at[1] - first)
        return WindowJob(j.id, j.gpus, j.duration, j.arrival, j.priority, allowed, hint)

    def accept(self, win: Window, answer: dict[str, tuple[int, int]]) -> bool:
        """Keep the window's new placement if it earns more; every block is checked to be
        one of the job's allowed starts, after its arrival and free, before it is kept."""
        gain = win.earned(answer)
        if gain <= 1e-6:
            return False
        offered = {wj.id: wj for wj in win.jobs}
        busy = _checked_window(win, offered, answer)
        keep = ((1 << self.s.gpus) - 1) ^ (((1 << win.rows) - 1) << win.first)  # the rows outside
        self.busy = [(b & keep) | (mine << win.first) for b, mine in zip(self.busy, busy, strict=True)]
        changed = [(win.first, win.rows)] + self._free_movers(win, offered, answer)
        for i, wj in offered.items():
            if wj.hint is not None or (wj.stay and i in answer):  # freed here, or a mover that moved
                self._drop(i)
        for i, (start, f) in answer.items():
            self._put(i, (start, f + win.first))
        dropped = [self.jobs[i] for i, wj in offered.items() if wj.hint is not None and i not in answer]
        self.pool = [j for j in self.pool if j.id not in answer]
        self.pool.extend(dropped)  # out of the window: offered again, after the rest
        self._late()
        self._refresh_idle(changed)
        self.gain += gain
        for failed in self.failed.values():
            failed.clear()
        return True

    def _free_movers(self, win: Window, offered: dict[str, WindowJob],
                     answer: dict[str, tuple[int, int]]) -> list[tuple[int, int]]:
        """Clear the old blocks of the movers the answer kept; the blocks (first row, rows) it freed."""
        changed = []
        for i in answer:
            if offered[i].stay:  # a mover: its old block, outside the window, is idle now
                start, f = self.placed[i]
                bits = ((1 << offered[i].gpus) - 1) << f
                for t in range(start, min(start + offered[i].duration, win.horizon)):
                    self.busy[t] ^= bits
                changed.append((f, offered[i].gpus))
        return changed

    def _refresh_idle(self, changed: list[tuple[int, int]]) -> None:
        for rows, idle in self.idle.items():  # the windows that overlap a changed block
            for f, n in changed:
                for k in range(f // rows, (f + n - 1) // rows + 1):
                    idle[k] = self._idle(rows, k * rows)

    def board(self) -> Board:
        """The current placement on a fresh copy of the pinned-and-realtime board."""
        b = self.base.copy()
        for i, (start, first) in sorted(self.placed.items(), key=lambda x: x[1]):
            b.place_block(i, first, self.jobs[i].gpus, start, start + self.jobs[i].duration)
        return b


def improve(
    s: Scenario, packed: Packed, solve: Solve, time_limit: float, seed: int = 0,
    iterations: int | None = None, started: float | None = None, masks: StartMasks | None = None,
) -> tuple[Board, dict[str, float | int | str]]:
    """Fast's placement improved window by window until `time_limit` seconds have passed
    since `started` (or `iterations` windows were tried); returns the board and stats.

    What is left at the end is kept for writing the grid: about what fast took to make it.
    """
    now = time.perf_counter()
    started = now if started is None else started
    deadline = started + time_limit - 0.05 - 1.5 * (now - started)
    state = Search(s, packed, masks or StartMasks(s), seed)
    sizes = {"greedy": [r for r in GREEDY_ROWS if r <= s.gpus] or [s.gpus],
             "exact": [r for r in EXACT_ROWS if r <= s.gpus] or [s.gpus]}
    exact = 0
    while iterations is None or state.tried < iterations:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        picked = _pick(state, sizes, state.tried)
        if picked is None:
            break  # every window is solved as well as both ways can
        method, spot = picked
        state.tried += 1
        win = state.sub_problem(*spot, attempt=state.failed[method].get(spot, 0))
        if method == "greedy":
            answer = recreate(win, state.rng)
        else:
            if left < EXACT_MIN_S:
                break  # too little time to build and solve a model
            exact += 1
            answer = solve(win, SOLVE_DETERMINISTIC_S, left, seed + state.tried)
        if answer is not None and state.accept(win, answer):
            state.improved += 1
        else:
            state.failed[method][spot] = state.failed[method].get(spot, 0) + 1
    stats: dict[str, float | int | str] = {"windows": state.tried, "exact_windows": exact,
                                          "improved": state.improved, "lns_gain": round(state.gain, 3)}
    # The gain re-counted from scratch, not from the windows' deltas: should the two ever
    # disagree, fast's own grid is returned, never a worse one.
    def total(placed: dict[str, tuple[int, int]]) -> float:
        return sum(value(state.jobs[i], start, state.w) for i, (start, _) in placed.items())

    if total(state.placed) < total(packed.placed) - 1e-6:
        stats.update(improved=0, lns_gain=0.0, discarded=1)
        return packed.board, stats
    return state.board(), stats


def _pick(state: Search, sizes: dict[str, list[int]], turn: int) -> tuple[str, tuple[int, int]] | None:
    """The next window: greedy while any window may still gain that way (a greedy window
    costs milliseconds, an exact one a few hundred), else exact; the height cycles with
    `turn`, skipping heights whose windows are all stale."""
    for method in ("greedy", "exact"):
        ring = sizes[method]
        for k in range(len(ring)):
            spot = state.window(ring[(turn + k) % len(ring)], method)
            if spot is not None:
                return method, spot
    return None


def _checked_window(win: Window, offered: dict[str, WindowJob], answer: dict[str, tuple[int, int]]) -> list[int]:
    """The window's busy rows with the answer's blocks, each checked allowed, after its arrival and free."""
    h = win.horizon
    busy = list(win.busy)
    for i, (start, f) in answer.items():
        wj = offered[i]
        assert wj.allowed >> f & 1 and wj.arrival <= start < h, f"{i}: block {f} at {start} not allowed"
        bits = ((1 << wj.gpus) - 1) << f
        for t in range(start, min(start + wj.duration, h)):
            assert not busy[t] & bits, f"{i}: block {f}+{wj.gpus} taken at step {t}"
            busy[t] |= bits
    return busy
