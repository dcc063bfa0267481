"""Tiling: split a step along its batch dimension into K independent tile streams.

The step is re-traced on each tile's slice of the inputs (re-tracing, not copying nodes,
because a trace bakes shapes into views and collective split sizes), and the K tile graphs are
stitched into one graph: input slices first, then the tiles' nodes, each tagged with its
stream in ``node.meta["rota_stream"]``, then one ``cat`` per output along its batch
dimension. The streams share nothing but graph inputs, so any interleaving of them that keeps
each stream's own order computes the same values (up to floating-point summation order in
kernels that block differently on a smaller batch).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from rota.jobkit.overlap.capture import Captured

__all__ = ["STREAM", "tile", "tile_bounds"]

#: node.meta key holding a node's tile stream.
STREAM = "rota_stream"

aten = torch.ops.aten


def tile_bounds(batch: int, k: int) -> list[tuple[int, int]]:
    """``k`` near-equal ``[start, end)`` ranges covering ``range(batch)``."""
    if k < 1:
        raise ValueError(f"tiles k must be at least 1, got {k}")
    if k > batch:
        raise ValueError(f"tiles k={k} exceeds the batch size {batch}")
    edges = [batch * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _slice(x: torch.Tensor, dim: int | None, start: int, end: int) -> torch.Tensor:
    if dim is None:
        return x
    return x.narrow(dim, start, end - start).contiguous()


def tile(captured: Captured, k: int = 2) -> fx.GraphModule:
    """The step as one graph of ``k`` tile streams (k=1 returns a copy of the captured graph)."""
    bounds = tile_bounds(captured.batch, k)
    traces: dict[int, fx.GraphModule] = {}
    root = torch.nn.Module()
    graph = fx.Graph()
    placeholders = [graph.placeholder(f"arg{i}") for i in range(len(captured.inputs))]
    outputs: list[list[fx.Node]] = []
    for stream, (start, end) in enumerate(bounds):
        if end - start not in traces:
            example = [_slice(x, d, start, end) for x, d in zip(captured.inputs, captured.batch_dims, strict=True)]
            traces[end - start] = make_fx(captured.step)(*example)
        traced = traces[end - start]
        env: dict[fx.Node, fx.Node] = {}
        inputs = iter(zip(placeholders, captured.batch_dims, strict=True))
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                ph, dim = next(inputs)
                if dim is None:
                    env[node] = ph
                else:
                    sliced = graph.call_function(aten.slice.Tensor, (ph, dim, start, end))
                    sliced.meta[STREAM] = stream
                    if dim:  # a slice off dim 0 is not contiguous; collectives want contiguous tensors
                        sliced = graph.call_function(aten.clone.default, (sliced,),
                                                     {"memory_format": torch.contiguous_format})
                        sliced.meta[STREAM] = stream
                    env[node] = sliced
            elif node.op == "output":
                outs = node.args[0]
                outputs.append([env[o] for o in (outs if isinstance(outs, list | tuple) else (outs,))])
            else:
                if node.op == "get_attr":
                    attr = f"t{stream}_{node.target}"
                    setattr(root, attr, getattr(traced, str(node.target)))
                    copied = graph.get_attr(attr)
                else:
                    copied = graph.node_copy(node, lambda n, env=env: env[n])  # type: ignore[misc]
                copied.meta[STREAM] = stream
                env[node] = copied
    if any(len(o) != len(captured.out_batch_dims) for o in outputs):
        raise ValueError(f"out_batch_dims has {len(captured.out_batch_dims)} entries; the step returns "
                         f"{len(outputs[0])} outputs")
    results = [graph.call_function(aten.cat.default, ([o[i] for o in outputs], dim)) if k > 1 else outputs[0][i]
               for i, dim in enumerate(captured.out_batch_dims)]
    graph.output(tuple(results))
    module = fx.GraphModule(root, graph)
    module.recompile()
    return module
