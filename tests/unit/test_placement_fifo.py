"""The live FIFO placement core (pure): arrival order, aligned blocks, readable waiting reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rota.allocator.placement import (
    Decision,
    NodeFree,
    QueuedJob,
    largest_free_block,
    lowest_aligned_block,
    place_fifo,
)


def node(name: str, gpus: int, busy: tuple[int, ...] = ()) -> NodeFree:
    return NodeFree(name, gpus, frozenset(busy))


def queue(*sizes: int) -> list[QueuedJob]:
    """Jobs j1, j2, ... in arrival order with the given GPU counts."""
    return [QueuedJob(f"j{i}", size) for i, size in enumerate(sizes, start=1)]


@dataclass
class Case:
    name: str
    nodes: list[NodeFree]
    queue: list[QueuedJob]
    placed: dict[str, tuple[str, tuple[int, ...]]]
    waiting: dict[str, str] = field(default_factory=dict)  # job -> a fragment of its reason


CASES = [
    Case(
        "a single job takes the lowest block of an empty node",
        [node("n1", 8)], queue(2),
        {"j1": ("n1", (0, 1))},
    ),
    Case(
        "jobs pack upwards in arrival order",
        [node("n1", 8)], queue(1, 2, 4),
        {"j1": ("n1", (0,)), "j2": ("n1", (2, 3)), "j3": ("n1", (4, 5, 6, 7))},
    ),
    Case(
        "a two-GPU job is never placed across an alignment boundary (never on GPUs 1-2)",
        [node("n1", 4, busy=(0, 3))], queue(2),
        {}, {"j1": "largest free block is 1"},
    ),
    Case(
        "a two-GPU job skips a partly busy block to the next aligned one",
        [node("n1", 4, busy=(0,))], queue(2),
        {"j1": ("n1", (2, 3))},
    ),
    Case(
        "busy GPUs are respected",
        [node("n1", 4, busy=(0, 1, 2))], queue(1),
        {"j1": ("n1", (3,))},
    ),
    Case(
        "a fully busy node places nothing",
        [node("n1", 2, busy=(0, 1))], queue(1),
        {}, {"j1": "largest free block is 0"},
    ),
    Case(
        "first fit goes to the next node (by name) when the first is full",
        [node("n2", 4), node("n1", 4, busy=(0, 1, 2, 3))], queue(2),
        {"j1": ("n2", (0, 1))},
    ),
    Case(
        "first fit prefers the first node by name even when a later one is emptier",
        [node("b", 8), node("a", 4, busy=(0,))], queue(1),
        {"j1": ("a", (1,))},
    ),
    Case(
        "jobs spill over several nodes in order",
        [node("n1", 2), node("n2", 2)], queue(2, 1, 1),
        {"j1": ("n1", (0, 1)), "j2": ("n2", (0,)), "j3": ("n2", (1,))},
    ),
    Case(
        "a blocked head job blocks every later job, even a small one that would fit",
        [node("n1", 4, busy=(0,))], queue(4, 1),
        {}, {"j1": "largest free block is 2", "j2": "queued behind j1"},
    ),
    Case(
        "jobs before the blocked one still start; the ones after it wait",
        [node("n1", 4)], queue(2, 4, 1),
        {"j1": ("n1", (0, 1))}, {"j2": "largest free block is 2", "j3": "queued behind j2"},
    ),
    Case(
        "with no live node every job waits with a reason",
        [], queue(1),
        {}, {"j1": "no live node"},
    ),
    Case(
        "a job bigger than any node says so",
        [node("n1", 4), node("n2", 2)], queue(8),
        {}, {"j1": "needs 8 GPUs on one node; the largest live node has 4"},
    ),
    Case(
        "a job that fits a node but not now reports the largest free block",
        [node("n1", 8, busy=(0, 4))], queue(4),
        {}, {"j1": "needs a free aligned block of 4 GPUs; the largest free block is 2"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_place_fifo(case: Case) -> None:
    result = place_fifo(case.nodes, case.queue)
    placed = {d.job_id: (d.node, d.gpus) for d in result.decisions}
    assert placed == case.placed
    assert set(result.waiting) == {j.id for j in case.queue} - set(case.placed)
    for job_id, fragment in case.waiting.items():
        assert fragment in result.waiting[job_id], result.waiting[job_id]


def test_decisions_keep_arrival_order_and_never_overlap() -> None:
    nodes = [node("n1", 8, busy=(5,)), node("n2", 4)]
    jobs = queue(1, 2, 1, 4, 2, 1, 1)
    result = place_fifo(nodes, jobs)
    order = [d.job_id for d in result.decisions]
    assert order == [j.id for j in jobs[: len(order)]], "decisions must be a prefix of the queue"
    used: set[tuple[str, int]] = {("n1", 5)}
    for d in result.decisions:
        size = len(d.gpus)
        assert d.gpus[0] % size == 0 and d.gpus == tuple(range(d.gpus[0], d.gpus[0] + size))
        for g in d.gpus:
            assert (d.node, g) not in used
            used.add((d.node, g))


def test_later_small_job_never_starts_before_a_blocked_earlier_one() -> None:
    # Plenty of single GPUs free, but the head needs a full 8-GPU node.
    nodes = [node("n1", 8, busy=(7,)), node("n2", 8, busy=(0,))]
    result = place_fifo(nodes, queue(8, 1, 1, 1))
    assert result.decisions == []
    assert all("queued behind j1" in result.waiting[j] for j in ("j2", "j3", "j4"))


def test_inputs_are_not_mutated() -> None:
    n = node("n1", 4)
    place_fifo([n], queue(2, 2))
    assert n.busy == frozenset()


def test_decision_type() -> None:
    assert place_fifo([node("n1", 1)], queue(1)).decisions == [Decision("j1", "n1", (0,))]


@pytest.mark.parametrize(
    ("gpus", "busy", "size", "expected"),
    [
        (8, (), 8, (0, 1, 2, 3, 4, 5, 6, 7)),
        (8, (0,), 4, (4, 5, 6, 7)),
        (8, (1, 5), 2, (2, 3)),
        (4, (0, 3), 2, None),
        (4, (), 8, None),
    ],
)
def test_lowest_aligned_block(gpus: int, busy: tuple[int, ...], size: int, expected: tuple[int, ...] | None) -> None:
    assert lowest_aligned_block(node("n", gpus, busy), size) == expected


@pytest.mark.parametrize(
    ("gpus", "busy", "expected"),
    [(8, (), 8), (8, (0,), 4), (8, (0, 4), 2), (4, (0, 2), 1), (2, (0, 1), 0), (6, (), 4), (0, (), 0)],
)
def test_largest_free_block(gpus: int, busy: tuple[int, ...], expected: int) -> None:
    assert largest_free_block(node("n", gpus, busy)) == expected
