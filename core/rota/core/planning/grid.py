"""The plan grid: a row per GPU, a cell per timestep, each cell a job id or None.

`Grid` is the output every policy returns and every reader re-checks. `Board` is the
mutable grid a policy fills, with one bitmask of busy GPUs per step beside the cells:
finding the lowest free aligned block over a window is then a few big-int operations
instead of a scan over cells, which is what keeps the fast policy in milliseconds at
1,024 GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from rota.core.planning.scenario import Scenario

Cell = str | None
Grid = list[list[Cell]]


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


def _align_masks(gpus: int) -> dict[int, int]:
    masks: dict[int, int] = {}
    size = 1
    while size <= gpus:
        m = 0
        for first in range(0, gpus, size):
            m |= 1 << first
        masks[size] = m
        size *= 2
    return masks


class Board:
    """A grid under construction; every write goes through here so the masks stay true."""

    def __init__(self, gpus: int, horizon: int) -> None:
        self.gpus = gpus
        self.horizon = horizon
        self.cells: Grid = empty(gpus, horizon)
        self.busy: list[int] = [0] * horizon
        self.full = (1 << gpus) - 1
        self._align = _align_masks(gpus)

    def copy(self) -> Board:
        b = Board.__new__(Board)
        b.gpus, b.horizon, b.full, b._align = self.gpus, self.horizon, self.full, self._align
        b.cells = [row[:] for row in self.cells]
        b.busy = self.busy[:]
        return b

    def free_mask(self, t0: int, t1: int) -> int:
        """GPUs free at every step of [t0, t1)."""
        taken = 0
        for t in range(t0, t1):
            taken |= self.busy[t]
        return self.full & ~taken

    def aligned_starts(self, size: int, t0: int, t1: int) -> int:
        """A mask with bit `first` set for each aligned block of `size` free over [t0, t1)."""
        x = self.free_mask(t0, t1)
        k = 1
        while k < size:  # after the fold, bit i means bits i..i+2k-1 are all free
            x &= x >> k
            k *= 2
        return x & self._align[size]

    def lowest_block(self, size: int, t0: int, t1: int) -> int | None:
        x = self.aligned_starts(size, t0, t1)
        return (x & -x).bit_length() - 1 if x else None

    def is_free(self, first: int, size: int, t0: int, t1: int) -> bool:
        want = ((1 << size) - 1) << first
        return self.free_mask(t0, t1) & want == want

    def place_block(self, job_id: str, first: int, size: int, t0: int, t1: int) -> None:
        bits = ((1 << size) - 1) << first
        for t in range(max(t0, 0), min(t1, self.horizon)):
            assert self.busy[t] & bits == 0, f"{job_id}: block {first}+{size} busy at step {t}"
            self.busy[t] |= bits
            for g in range(first, first + size):
                self.cells[g][t] = job_id

    def place_cell(self, job_id: str, g: int, t: int) -> None:
        assert not self.busy[t] >> g & 1, f"{job_id}: GPU {g} busy at step {t}"
        self.busy[t] |= 1 << g
        self.cells[g][t] = job_id

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
