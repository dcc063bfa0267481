"""Segmented round-robin reordering of a tiled graph.

Within a stream, a segment is a run of consecutive ops that do not block: compute and
collective issues. A segment ends where the stream next has to wait on a collective; the wait
opens the stream's next segment. Segments are then issued round-robin across streams (stream
0's first segment, stream 1's first, ..., stream 0's second, ...), so while one stream waits
for its collective the others compute; a collective issued at the end of one stream's segment
travels while the next stream's segment runs.

The order keeps every stream's own order, puts ops belonging to no stream (input slices)
first and the output concatenation last, so it is a valid topological order whenever the
streams share nothing but graph inputs, which :func:`rota.jobkit.overlap.tiling.tile` guarantees.
"""

from __future__ import annotations

import torch.fx as fx

from rota.jobkit.overlap.capture import is_wait
from rota.jobkit.overlap.tiling import STREAM

__all__ = ["reorder", "rebuild", "segments"]


def segments(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """Split one stream's nodes into segments, a new one starting at each wait."""
    out: list[list[fx.Node]] = [[]]
    for node in nodes:
        if is_wait(node) and out[-1]:
            out.append([])
        out[-1].append(node)
    return [s for s in out if s]


def round_robin_order(graph: fx.Graph) -> list[fx.Node]:
    head: list[fx.Node] = []
    tail: list[fx.Node] = []
    streams: dict[int, list[fx.Node]] = {}
    for node in graph.nodes:
        stream = node.meta.get(STREAM)
        if stream is not None:
            streams.setdefault(stream, []).append(node)
        elif streams:
            tail.append(node)
        else:
            head.append(node)
    per_stream = [segments(streams[s]) for s in sorted(streams)]
    order = list(head)
    for i in range(max((len(s) for s in per_stream), default=0)):
        for segs in per_stream:
            if i < len(segs):
                order.extend(segs[i])
    return order + tail


def rebuild(module: fx.GraphModule, order: list[fx.Node]) -> fx.GraphModule:
    """A new module with ``module``'s nodes in ``order`` (checked to be topological)."""
    placed: set[fx.Node] = set()
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in order:
        for dep in node.all_input_nodes:
            if dep not in placed:
                raise ValueError(f"order: node {node.name} comes before its input {dep.name}")
        env[node] = graph.node_copy(node, lambda n: env[n])
        placed.add(node)
    if len(placed) != len(module.graph.nodes):
        raise ValueError("order: does not hold every node of the graph exactly once")
    out = fx.GraphModule(module, graph)
    out.recompile()
    return out


def reorder(module: fx.GraphModule) -> fx.GraphModule:
    """The tiled graph with its streams' segments issued round-robin."""
    return rebuild(module, round_robin_order(module.graph))
