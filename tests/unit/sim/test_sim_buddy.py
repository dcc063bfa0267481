"""Buddy blocks: aligned, never straddling a node, merged back when freed."""

from __future__ import annotations

import random

import pytest

from rota.sim.buddy import Buddy


def test_blocks_are_aligned_to_their_size_and_disjoint() -> None:
    b = Buddy(64, 8)
    taken: set[int] = set()
    rng = random.Random(1)
    for _ in range(40):
        order = rng.choice([0, 1, 2, 3])
        off = b.alloc(order)
        if off is None:
            continue
        size = 1 << order
        assert off % size == 0
        assert off // 8 == (off + size - 1) // 8  # within one node
        block = set(range(off, off + size))
        assert not block & taken
        taken |= block
    assert b.free_gpus == 64 - len(taken)


def test_freeing_everything_merges_back_to_the_top_blocks() -> None:
    b = Buddy(24, 8)  # not a power of two: top blocks 16 at 0 and 8 at 16
    assert b.free[4] == {0} and b.free[3] == {16}
    offs = [(b.alloc(0), 0) for _ in range(24)]
    assert b.alloc(0) is None and b.free_gpus == 0
    for off, order in offs:
        assert off is not None
        b.release(off, order)
    assert b.free[4] == {0} and b.free[3] == {16} and b.free_gpus == 24


def test_best_fit_keeps_the_large_block_whole() -> None:
    b = Buddy(16, 8)
    first = b.alloc(0)
    assert first == 0
    b.alloc(3)  # the second node: the first one is broken already
    assert b.alloc(1) == 2  # next to the 1-GPU job, not in a fresh block
    assert b.largest_free_order() == 2


def test_claim_takes_an_exact_block_only_when_all_of_it_is_free() -> None:
    b = Buddy(8, 8)
    assert b.claim(4, 2)
    assert not b.claim(4, 1)
    assert b.claim(2, 1)
    assert b.alloc(2) is None and b.alloc(1) == 0


def test_soft_gpus_are_avoided_while_clean_ones_exist_and_refused_on_request() -> None:
    b = Buddy(8, 8)
    soft = bytearray(8)
    soft[0:4] = b"\x01" * 4
    assert b.alloc(2, soft) == 4
    assert b.alloc(1, soft, use_soft=False) is None
    assert b.alloc(1, soft) == 0


@pytest.mark.parametrize(("gpus", "gpn"), [(12, 8), (16, 3), (0, 8)])
def test_sizes_that_cannot_be_cut_into_nodes_are_refused(gpus: int, gpn: int) -> None:
    with pytest.raises(ValueError):
        Buddy(gpus, gpn)
