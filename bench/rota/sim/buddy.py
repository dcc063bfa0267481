"""Buddy allocation of GPUs (docs/design.md §3 constraint 3): a job of n = 2^k GPUs gets a block of n
consecutive GPU indices aligned to n, so with power-of-two nodes it never straddles a node
(and a job larger than a node gets whole, adjacent nodes).

GPU indices run node by node (node i holds [i·gpn, (i+1)·gpn)). A cluster whose size is not
a power of two is cut into maximal aligned top blocks, largest first; a top block's buddy
lies past the end of the cluster, so it never merges.
"""

from __future__ import annotations

from collections.abc import Callable


class Buddy:
    def __init__(self, total: int, gpus_per_node: int = 8) -> None:
        if gpus_per_node <= 0 or gpus_per_node & (gpus_per_node - 1):
            raise ValueError(f"gpus_per_node must be a power of two, got {gpus_per_node}")
        if total <= 0 or total % gpus_per_node:
            raise ValueError(f"gpus must be a positive multiple of gpus_per_node ({gpus_per_node})")
        self.total = total
        self.free_gpus = total
        self.max_order = total.bit_length() - 1
        self.free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        off = 0
        while off < total:
            k = (total - off).bit_length() - 1
            while off % (1 << k):
                k -= 1
            self.free[k].add(off)
            off += 1 << k

    def largest_free_order(self) -> int:
        """Order of the largest free block, -1 when nothing is free."""
        for k in range(self.max_order, -1, -1):
            if self.free[k]:
                return k
        return -1

    def _split_to(self, off: int, k: int, order: int, keep: int) -> None:
        """Split free block (off, k) down to `order`, keeping the half that holds `keep`."""
        while k > order:
            k -= 1
            half = off + (1 << k)
            if keep >= half:
                self.free[k].add(off)
                off = half
            else:
                self.free[k].add(half)

    def alloc(
        self, order: int, soft: bytearray | None = None, use_soft: bool = True, allowed: int | None = None
    ) -> int | None:
        """Take a block of 2^order GPUs; best fit (smallest free order) to keep big blocks whole.

        `soft` marks GPUs that are free only because their job's lease is up for renewal:
        a block clear of them is preferred at any order, so renewals are not disturbed
        while truly idle GPUs exist; with use_soft=False only such blocks are taken.
        `allowed`, when given, is a bitmask of the starts the job may take (its GPU types
        and switch: `rota.core.planning.constraints.StartMasks`); other blocks are passed over.
        """
        if order > self.max_order:
            return None
        if soft is not None:
            sub = self._first_start(order, lambda sub, size: soft.find(1, sub, sub + size) == -1
                                    and (allowed is None or bool(allowed >> sub & 1)))
            if sub is not None:
                return sub
            if not use_soft:
                return None
        if allowed is None:
            for k in range(order, self.max_order + 1):
                if self.free[k]:
                    off = min(self.free[k])
                    return self._take(off, k, order, off)
            return None
        return self._first_start(order, lambda sub, size: bool(allowed >> sub & 1))

    def _first_start(self, order: int, ok: Callable[[int, int], bool]) -> int | None:
        """Takes the first block of 2^order, by best fit then offset, whose start `ok` accepts."""
        size = 1 << order
        for k in range(order, self.max_order + 1):
            for off in sorted(self.free[k]):
                for sub in range(off, off + (1 << k), size):
                    if ok(sub, size):
                        return self._take(off, k, order, sub)
        return None

    def _take(self, off: int, k: int, order: int, sub: int) -> int:
        """Split free block (off, k) down to the block of 2^order at `sub`, and take it."""
        self.free[k].discard(off)
        self._split_to(off, k, order, sub)
        self.free_gpus -= 1 << order
        return sub

    def claim(self, off: int, order: int) -> bool:
        """Take exactly the block at `off` of 2^order GPUs if all of it is free."""
        for k in range(order, self.max_order + 1):
            base = off & ~((1 << k) - 1)
            if base in self.free[k]:
                self.free[k].discard(base)
                self._split_to(base, k, order, off)
                self.free_gpus -= 1 << order
                return True
        return False

    def release(self, off: int, order: int) -> None:
        self.free_gpus += 1 << order
        k = order
        while k < self.max_order:
            buddy = off ^ (1 << k)
            if buddy not in self.free[k]:
                break
            self.free[k].discard(buddy)
            off = min(off, buddy)
            k += 1
        self.free[k].add(off)
