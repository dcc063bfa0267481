"""The paged KV cache's block pool: allocation, prefix hits by hashed chains, LRU eviction
of unreferenced blocks only; and the engine's use of it (hits, recompute counters)."""

from __future__ import annotations

import pytest

from rota.jobkit.inference.kvcache import BLOCK_SIZE, BlockPool, chain_hashes


def filled(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Allocate and commit the blocks of ``tokens``, as a finished prefill leaves them."""
    blocks = []
    for h in chain_hashes(tokens):
        b = pool.allocate()
        assert b is not None
        pool.commit(b, h)
        blocks.append(b)
    return blocks


def test_chain_hashes_name_whole_prefixes() -> None:
    a = list(range(48))
    b = list(range(16)) + [99] + list(range(17, 48))
    ha, hb = chain_hashes(a), chain_hashes(b)
    assert len(ha) == 3 and len(chain_hashes(a[:47])) == 2  # only full blocks are named
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]  # a change breaks the rest of the chain
    assert chain_hashes(a) == ha  # deterministic


def test_released_blocks_stay_cached_and_are_hit_again() -> None:
    pool = BlockPool(8)
    tokens = list(range(3 * BLOCK_SIZE))
    blocks = filled(pool, tokens)
    assert pool.usage() == pytest.approx(3 / 8)
    pool.release(blocks)
    assert pool.usage() == 0.0 and pool.num_cached == 3
    hit = pool.match(chain_hashes(tokens + [7, 7]))
    assert hit == blocks
    pool.take(hit)
    assert pool.usage() == pytest.approx(3 / 8) and all(pool.refs(b) == 1 for b in blocks)


def test_a_prefix_match_stops_at_the_first_missing_block() -> None:
    pool = BlockPool(8)
    tokens = list(range(4 * BLOCK_SIZE))
    blocks = filled(pool, tokens)
    pool.release(blocks)  # tail first: the last block is the oldest in LRU order
    assert pool.allocate() == 4  # never-used blocks go first: nothing evicted yet
    assert pool.evictions == 0
    for _ in range(3):
        pool.allocate()
    evicted = pool.allocate()  # the pool is out of empty blocks: evict the LRU one
    assert evicted == blocks[-1] and pool.evictions == 1
    assert pool.match(chain_hashes(tokens)) == blocks[:3]


def test_referenced_blocks_are_never_evicted() -> None:
    pool = BlockPool(4)
    held = filled(pool, list(range(2 * BLOCK_SIZE)))  # still referenced
    other = filled(pool, list(range(100, 100 + 2 * BLOCK_SIZE)))
    pool.release(other)
    got = [pool.allocate(), pool.allocate()]
    assert sorted(b for b in got if b is not None) == sorted(other)
    assert pool.allocate() is None  # only referenced blocks remain: no eviction, no block
    assert all(pool.refs(b) == 1 for b in held)
    assert pool.match(chain_hashes(list(range(2 * BLOCK_SIZE)))) == held


def test_lru_order_follows_last_release() -> None:
    pool = BlockPool(2)
    a, b = filled(pool, list(range(BLOCK_SIZE))), filled(pool, list(range(50, 50 + BLOCK_SIZE)))
    pool.release(a)
    pool.release(b)
    pool.take(a)  # a is used again, then released: now b is the older one
    pool.release(a)
    assert pool.allocate() == b[0]


def test_a_duplicate_of_a_resident_block_stays_anonymous() -> None:
    pool = BlockPool(4)
    tokens = list(range(BLOCK_SIZE))
    first = filled(pool, tokens)
    second = filled(pool, tokens)  # computed again while the first was unreachable
    pool.release(second)
    assert pool.num_cached == 1 and pool.match(chain_hashes(tokens)) == first
    assert pool.allocate() == second[0] and pool.evictions == 0  # reused first, evicting nothing


def test_bad_use_is_refused() -> None:
    with pytest.raises(ValueError, match="^cache_blocks: "):
        BlockPool(0)
    pool = BlockPool(2)
    b = pool.allocate()
    assert b is not None
    pool.release([b])
    with pytest.raises(ValueError, match="released more often"):
        pool.release([b])
