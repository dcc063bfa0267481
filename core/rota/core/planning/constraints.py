"""Where a job may be placed: its GPU types and its switch, as bitmasks of aligned starts.

Every policy finds blocks as masks of free aligned starts (`Board.aligned_starts`); a
job's placement constraints are one more mask to AND with it: bit `f` set means the
block [f, f + size) holds only GPUs of a type the job accepts (and, for a job that must
stay under one switch, lies under one switch). Masks depend only on the scenario, so they
are computed once per (types, same_switch, size) and shared by every policy and order.

A scenario without `node_types` (or `node_switches`) does not model them: the
constraint is then no constraint.
"""

from __future__ import annotations

from functools import lru_cache

from rota.core.planning.grid import aligned_mask, fold
from rota.core.planning.scenario import BatchJob, Scenario


class StartMasks:
    def __init__(self, s: Scenario) -> None:
        self.gpus = s.gpus
        self.per_node = s.gpus_per_node
        self.full = (1 << s.gpus) - 1
        self.node_types = s.node_types
        self.node_switches = s.node_switches
        self._align: dict[int, int] = {}
        self.allowed_for = lru_cache(maxsize=None)(self._allowed)
        self.one_switch = lru_cache(maxsize=None)(self._one_switch)
        self.span_tiers = lru_cache(maxsize=None)(self._span_tiers)

    def aligned(self, size: int) -> int:
        if size not in self._align:
            self._align[size] = aligned_mask(self.gpus, size)
        return self._align[size]

    def _rows_of(self, nodes: list[int]) -> int:
        block = (1 << self.per_node) - 1
        m = 0
        for i in nodes:
            m |= block << (i * self.per_node)
        return m

    def _allowed(self, types: frozenset[str], same_switch: bool, size: int) -> int:
        x = self.full
        if types and self.node_types:
            x = self._rows_of([i for i, t in enumerate(self.node_types) if t in types])
        x = fold(x, size) & self.aligned(size)
        if same_switch:
            x &= self.one_switch(size)
        return x

    def allowed(self, j: BatchJob) -> int:
        """Aligned starts of j.gpus that j may take (all of them when j is unconstrained)."""
        return self.allowed_for(j.gpu_types, j.same_switch, j.gpus)

    def _one_switch(self, size: int) -> int:
        """Aligned starts whose block lies under one switch (every start if no switches)."""
        if not self.node_switches or size <= self.per_node:
            return self.aligned(size)
        out = 0
        for first in range(0, self.gpus, size):
            nodes = range(first // self.per_node, (first + size) // self.per_node)
            if len({self.node_switches[i] for i in nodes}) == 1:
                out |= 1 << first
        return out

    def _span_tiers(self, size: int) -> tuple[int, ...]:
        """The aligned starts of `size` grouped by how many switches their block spans,
        fewest first (empty groups left out): the order a gang's block is chosen in."""
        if not self.node_switches or size <= self.per_node:
            return (self.aligned(size),)
        tiers: dict[int, int] = {}
        for first in range(0, self.gpus, size):
            n = self.switches_spanned(first, size)
            tiers[n] = tiers.get(n, 0) | 1 << first
        return tuple(tiers[n] for n in sorted(tiers))

    def switches_spanned(self, first: int, size: int) -> int:
        """How many switches the block [first, first + size) spans (1 without switches)."""
        if not self.node_switches:
            return 1
        lo, hi = first // self.per_node, max(first // self.per_node + 1, (first + size) // self.per_node)
        return len({self.node_switches[i] for i in range(lo, hi)})

    def rows_for(self, types: frozenset[str]) -> int:
        """The rows of GPUs of the accepted `types` (every row when unconstrained): where a
        realtime app's replicas, one GPU each, may go."""
        if not types or not self.node_types:
            return self.full
        return self._rows_of([i for i, t in enumerate(self.node_types) if t in types])

    def is_allowed(self, j: BatchJob, first: int) -> bool:
        return bool(self.allowed(j) >> first & 1)
