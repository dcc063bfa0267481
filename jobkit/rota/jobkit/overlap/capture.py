"""Trace a model-parallel step to an FX graph whose collectives are explicit nodes.

``make_fx`` traces a function calling ``torch.distributed._functional_collectives`` into
aten ops plus ``_c10d_functional`` collectives (``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``), each followed by a ``wait_tensor`` node:
the collective node issues the work and returns at once, the wait blocks until it is done.
That split is what the passes move around. The process group appears in the graph by its
name, so a captured graph runs on the ranks that traced it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from rota.jobkit.overlap.blocks import Block, StepFn

__all__ = ["COLLECTIVE_KINDS", "Captured", "capture", "capture_block", "collective_kind", "collective_kinds", "is_collective",
           "is_wait", "run_graph"]

_c10d = torch.ops._c10d_functional

#: The collective ops the passes know, by the name used in plans and costs.
COLLECTIVE_KINDS: dict[str, object] = {
    "all_reduce": _c10d.all_reduce.default,
    "all_gather_into_tensor": _c10d.all_gather_into_tensor.default,
    "reduce_scatter_tensor": _c10d.reduce_scatter_tensor.default,
    "all_to_all_single": _c10d.all_to_all_single.default,
}
_KIND_OF_TARGET = {target: kind for kind, target in COLLECTIVE_KINDS.items()}
WAIT = _c10d.wait_tensor.default


def collective_kind(node: fx.Node) -> str | None:
    """The collective's kind when ``node`` issues one, else None."""
    if node.op != "call_function":
        return None
    return _KIND_OF_TARGET.get(node.target)  # type: ignore[call-overload]


def collective_kinds(module: fx.GraphModule) -> list[str]:
    """The kinds of collective ``module`` issues, sorted."""
    return sorted({k for n in module.graph.nodes if (k := collective_kind(n)) is not None})


def is_collective(node: fx.Node) -> bool:
    return collective_kind(node) is not None


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is WAIT


@dataclass
class Captured:
    """A traced step with what tiling needs to re-trace it on slices of its inputs."""

    step: StepFn
    inputs: tuple[torch.Tensor, ...]
    batch_dims: tuple[int | None, ...]
    out_batch_dims: tuple[int, ...]
    graph: fx.GraphModule

    @property
    def batch(self) -> int:
        sizes = {x.shape[d] for x, d in zip(self.inputs, self.batch_dims, strict=True) if d is not None}
        if len(sizes) != 1:
            raise ValueError(f"batch_dims: batched inputs must agree on one batch size, got {sorted(sizes)}")
        return sizes.pop()


def capture(step: StepFn, inputs: Sequence[torch.Tensor], batch_dims: Sequence[int | None],
            out_batch_dims: Sequence[int]) -> Captured:
    """Trace ``step`` on ``inputs`` (real tensors; collectives run once while tracing)."""
    inputs = tuple(inputs)
    if len(batch_dims) != len(inputs):
        raise ValueError(f"batch_dims has {len(batch_dims)} entries for {len(inputs)} inputs")
    for i, (x, d) in enumerate(zip(inputs, batch_dims, strict=True)):
        if d is not None and not 0 <= d < x.dim():
            raise ValueError(f"batch_dims[{i}]={d} is not a dimension of an input of shape {tuple(x.shape)}")
    graph = make_fx(step)(*inputs)
    captured = Captured(step, inputs, tuple(batch_dims), tuple(out_batch_dims), graph)
    _ = captured.batch
    if not any(is_collective(n) for n in graph.graph.nodes):
        raise ValueError("step: the traced graph holds no functional collective")
    return captured


def capture_block(block: Block) -> Captured:
    return capture(block.step, block.inputs, block.batch_dims, block.out_batch_dims)


def run_graph(graph: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Run a graph and return its outputs as a tuple (make_fx returns a list or a tuple)."""
    out = graph(*inputs)
    return tuple(out) if isinstance(out, list | tuple) else (out,)
