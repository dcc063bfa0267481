"""Live placement, FIFO baseline (pure): the queue in arrival order onto free buddy blocks.

This is SPEC §3's FIFO applied to the present step of a real cluster: jobs start in strict
arrival order (a job never starts before one that arrived earlier), each in the lowest
aligned block of its size that is free now; priority is ignored. A head job that does not
fit blocks the queue, and every waiting job gets a reason a user can read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeFree:
    name: str
    gpu_count: int
    busy: frozenset[int]


@dataclass(frozen=True)
class QueuedJob:
    id: str
    gpus: int


@dataclass(frozen=True)
class Decision:
    job_id: str
    node: str
    gpus: tuple[int, ...]


@dataclass
class PlacementResult:
    decisions: list[Decision] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)


def lowest_aligned_block(node: NodeFree, size: int) -> tuple[int, ...] | None:
    """The lowest block [k*size, (k+1)*size) of the node whose GPUs are all free."""
    for start in range(0, node.gpu_count - size + 1, size):
        block = tuple(range(start, start + size))
        if not node.busy.intersection(block):
            return block
    return None


def largest_free_block(node: NodeFree) -> int:
    size = 1 << max(0, node.gpu_count.bit_length() - 1)
    while size >= 1:
        if lowest_aligned_block(node, size) is not None:
            return size
        size //= 2
    return 0


def place_fifo(nodes: Sequence[NodeFree], queue: Sequence[QueuedJob]) -> PlacementResult:
    """Places the longest prefix of `queue` that fits, in order; the rest waits."""
    result = PlacementResult()
    free = {n.name: n for n in sorted(nodes, key=lambda n: n.name)}
    blocked_by: str | None = None
    for job in queue:
        if blocked_by is not None:
            result.waiting[job.id] = f"queued behind {blocked_by} (FIFO: jobs start in arrival order)"
            continue
        decision = _first_fit(free, job)
        if decision is None:
            result.waiting[job.id] = _why_not(free.values(), job)
            blocked_by = job.id
            continue
        node = free[decision.node]
        free[decision.node] = NodeFree(node.name, node.gpu_count, node.busy | frozenset(decision.gpus))
        result.decisions.append(decision)
    return result


def _first_fit(free: dict[str, NodeFree], job: QueuedJob) -> Decision | None:
    for node in free.values():
        block = lowest_aligned_block(node, job.gpus)
        if block is not None:
            return Decision(job.id, node.name, block)
    return None


def _why_not(nodes: Iterable[NodeFree], job: QueuedJob) -> str:
    node_list = list(nodes)
    if not node_list:
        return "waiting: no live node in the cluster"
    biggest = max(n.gpu_count for n in node_list)
    if job.gpus > biggest:
        return f"waiting: needs {job.gpus} GPUs on one node; the largest live node has {biggest}"
    best = max(largest_free_block(n) for n in node_list)
    return f"waiting: needs a free aligned block of {job.gpus} GPUs; the largest free block is {best}"
