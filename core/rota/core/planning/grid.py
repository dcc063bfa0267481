"""The plan grid: a row per GPU, a cell per timestep, each cell a job id or None.

`Grid` is the output every policy returns and every reader re-checks. `Board` is the
mutable grid a policy fills, with one bitmask of busy GPUs per step beside the cells:
finding the lowest free aligned block over a window is then a few big-int operations
instead of a scan over cells, which is what keeps the fast policy in milliseconds at
thousands of GPUs.

A board writes its cells lazily: a placement updates the busy masks at once and is logged,
and the cells are only written when `cells` is read. Fast fills one copy of the board per
queue order and keeps one, so only the winner's 8,192 x 24 cells are ever written.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import reduce
from operator import or_

from rota.core.planning.scenario import Scenario

Cell = str | None
Grid = list[list[Cell]]
# A logged write: (job, first GPU, GPUs, t0, t1) for a block, or (job, mask, -1, t, t + 1)
# for the GPUs of one step given as a bitmask (a realtime app's holding).
_Op = tuple[str, int, int, int, int]


def empty(gpus: int, horizon: int) -> Grid:
    return [[None] * horizon for _ in range(gpus)]


def cells_by_job(grid: Grid) -> dict[str, list[set[int]]]:
    """For each job id, the set of GPUs it holds at each step."""
    horizon = len(grid[0]) if grid else 0
    out: dict[str, list[set[int]]] = defaultdict(lambda: [set() for _ in range(horizon)])
    for g, row in enumerate(grid):
        for t, cell in enumerate(row):
            if cell is not None:
                out[cell][t].add(g)
    return dict(out)


def aligned_mask(gpus: int, size: int) -> int:
    """Bit `first` for each multiple of `size` below `gpus` (both powers of two, size <=
    gpus): 1 + 2^size + 2^2size + ..., the geometric series' sum, one division instead
    of a loop over thousands of starts."""
    return ((1 << gpus) - 1) // ((1 << size) - 1)


def _align_masks(gpus: int) -> dict[int, int]:
    masks: dict[int, int] = {}
    size = 1
    while size <= gpus:
        masks[size] = aligned_mask(gpus, size)
        size *= 2
    return masks


def fold(x: int, size: int) -> int:
    """Bit i set when bits i..i+size-1 of x are all set (size a power of two)."""
    k = 1
    while k < size:
        x &= x >> k
        k *= 2
    return x


def runs(mask: int) -> list[tuple[int, int]]:
    """The maximal runs of set bits of `mask` as (first, length), lowest first."""
    out = []
    while mask:
        first = (mask & -mask).bit_length() - 1
        y = mask >> first
        length = (y ^ (y + 1)).bit_length() - 1  # the trailing ones of y
        out.append((first, length))
        mask &= ~(((1 << length) - 1) << first)
    return out


def highest_bits(mask: int, k: int) -> int:
    """The k highest set bits of `mask` (all of them if it has fewer)."""
    if k <= 0:
        return 0
    if mask.bit_count() <= k:
        return mask
    lo, hi = 0, mask.bit_length()  # the largest p with k bits at or above it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if (mask >> mid).bit_count() >= k:
            lo = mid
        else:
            hi = mid - 1
    return mask >> lo << lo


class Board:
    """A grid under construction; every write goes through here so the masks stay true."""

    def __init__(self, gpus: int, horizon: int) -> None:
        self.gpus = gpus
        self.horizon = horizon
        self.busy: list[int] = [0] * horizon
        self.full = (1 << gpus) - 1
        self._align = _align_masks(gpus)
        self._base: Grid | None = None  # cells written before the log; shared, never mutated
        self._log: list[_Op] = []
        self._cells: Grid | None = None  # base + log, written on the first read of `cells`
        self._applied = 0

    @property
    def cells(self) -> Grid:
        if self._cells is None:
            self._cells = [row[:] for row in self._base] if self._base else empty(self.gpus, self.horizon)
            self._applied = 0
        for job_id, a, size, t0, t1 in self._log[self._applied :]:
            if size < 0:  # one step, a mask of GPUs
                for first, n in runs(a):
                    for g in range(first, first + n):
                        self._cells[g][t0] = job_id
                continue
            span = [job_id] * (t1 - t0)
            for g in range(a, a + size):
                self._cells[g][t0:t1] = span
        self._applied = len(self._log)
        return self._cells

    def copy(self) -> Board:
        # The copy shares the written cells and the log so far (both immutable from here on
        # for it): nothing is written until one of the boards has its cells read.
        b = Board.__new__(Board)
        b.gpus, b.horizon, b.full, b._align = self.gpus, self.horizon, self.full, self._align
        b.busy = self.busy[:]
        if self._cells is not None:  # this board's cells are written: freeze them as the base
            self._base, self._log, self._cells, self._applied = self._cells, self._log[self._applied :], None, 0
        b._base, b._log, b._cells, b._applied = self._base, self._log[:], None, 0
        return b

    def free_mask(self, t0: int, t1: int) -> int:
        """GPUs free at every step of [t0, t1)."""
        return self.full ^ reduce(or_, self.busy[t0:t1], 0)  # ^ not & ~: busy lies within full, and ~ is slow

    def aligned_starts(self, size: int, t0: int, t1: int) -> int:
        """A mask with bit `first` set for each aligned block of `size` free over [t0, t1)."""
        return fold(self.free_mask(t0, t1), size) & self._align[size]

    def lowest_block(self, size: int, t0: int, t1: int, allowed: int = -1) -> int | None:
        """The lowest aligned block free over [t0, t1) among the starts in `allowed`."""
        x = self.aligned_starts(size, t0, t1) & allowed
        return (x & -x).bit_length() - 1 if x else None

    def is_free(self, first: int, size: int, t0: int, t1: int) -> bool:
        want = ((1 << size) - 1) << first
        return self.free_mask(t0, t1) & want == want

    def place_block(self, job_id: str, first: int, size: int, t0: int, t1: int) -> None:
        bits = ((1 << size) - 1) << first
        t0, t1 = max(t0, 0), min(t1, self.horizon)
        if t1 <= t0:
            return
        window = self.busy[t0:t1]
        assert not reduce(or_, window) & bits, f"{job_id}: block {first}+{size} busy in steps {t0}..{t1 - 1}"
        self.busy[t0:t1] = [x | bits for x in window]
        self._log.append((job_id, first, size, t0, t1))

    def place_mask(self, job_id: str, mask: int, t: int) -> None:
        """The GPUs of `mask` to `job_id` at step t."""
        assert self.busy[t] & mask == 0, f"{job_id}: GPUs {mask:#x} busy at step {t}"
        if mask:
            self.busy[t] |= mask
            self._log.append((job_id, mask, -1, t, t + 1))

    def place_cell(self, job_id: str, g: int, t: int) -> None:
        self.place_mask(job_id, 1 << g, t)

    def free_count(self, t: int) -> int:
        return self.gpus - self.busy[t].bit_count()


@dataclass
class Plan:
    """What a policy returns: the grid, plus whatever the policy reports about itself."""

    grid: Grid
    stats: dict[str, float | int | str] = field(default_factory=dict)


def pinned_board(s: Scenario) -> Board:
    """A board holding only the jobs already running, exactly where they are (constraint 2)."""
    b = Board(s.gpus, s.horizon)
    for j in s.batch:
        if j.running:
            b.place_block(j.id, j.running.first_gpu, j.gpus, 0, j.running.started + j.duration)
    return b
