"""The paged KV cache's bookkeeping: a preallocated pool of 16-token blocks, prefix
caching by hashed block chains, and LRU eviction of unreferenced blocks.

A block is *referenced* while some running sequence's block table holds it. When the
last reference goes, a block whose content is known (it was full when committed: its
hash names its tokens and every token before it) stays in the cache, unreferenced, at the
young end of the LRU order; a later request whose prompt starts with the same chain takes
it back without computing it (a prefix hit). A new block comes from the never-used or
content-less free blocks first, then by evicting the oldest unreferenced cached block.
Referenced blocks are never evicted. A sequence's blocks are released tail first, so, as
in vLLM, its last blocks are evicted before its first ones.

The tensors live with the model (``TinyDecoder.new_pool``); slot ``b * 16 + i`` is the
``i``-th token of block ``b``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

__all__ = ["BLOCK_SIZE", "BlockPool", "chain_hashes"]

BLOCK_SIZE = 16


def chain_hashes(tokens: Sequence[int], parent: int | None = None) -> list[int]:
    """The hash of each full block of ``tokens``: each names the block's tokens and its
    parent's hash, so equal hashes mean equal prefixes (Python's tuple hash of ints is
    deterministic across runs)."""
    out: list[int] = []
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hash((parent, tuple(tokens[start:start + BLOCK_SIZE])))
        out.append(parent)
    return out


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"cache_blocks: must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._empty: deque[int] = deque(range(num_blocks))  # free, holding nothing reusable
        self._lru: OrderedDict[int, None] = OrderedDict()  # free, cached; oldest first
        self.evictions = 0

    # -- what the scheduler asks -------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._empty) + len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def usage(self) -> float:
        """The fraction of blocks held by running sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free / self.num_blocks

    def refs(self, block: int) -> int:
        return self._refs[block]

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._by_hash

    def match(self, hashes: Sequence[int]) -> list[int]:
        """The blocks of the longest resident prefix of ``hashes`` (nothing is taken)."""
        blocks: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def free_after_taking(self, blocks: Sequence[int]) -> int:
        """How many blocks could still be allocated once ``blocks`` are taken."""
        return self.num_free - sum(1 for b in blocks if self._refs[b] == 0)

    # -- changes -----------------------------------------------------------------------
    def take(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks (a prefix hit)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._lru[b]
            self._refs[b] += 1

    def allocate(self) -> int | None:
        """A fresh block with one reference, or None when every block is referenced."""
        if self._empty:
            block = self._empty.popleft()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            old = self._hash[block]
            assert old is not None
            del self._by_hash[old]
            self._hash[block] = None
            self.evictions += 1
        else:
            return None
        self._refs[block] = 1
        return block

    def commit(self, block: int, block_hash: int) -> None:
        """Name a full, computed block by its chain hash so later prompts can hit it. A
        duplicate of a resident block (recomputed while the original was unreachable)
        stays anonymous and is reused first."""
        if self._hash[block] is None and block_hash not in self._by_hash:
            self._hash[block] = block_hash
            self._by_hash[block_hash] = block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block, tail first."""
        for b in reversed(blocks):
            if self._refs[b] <= 0:
                raise ValueError(f"block {b} released more often than taken")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                if self._hash[b] is None:
                    self._empty.appendleft(b)
                else:
                    self._lru[b] = None
