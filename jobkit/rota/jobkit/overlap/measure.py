"""Measured step time and peak memory of a graph, and its compute-only twin.

- :func:`time_step`: median wall time of a step over iterations that all ranks start together
  (a barrier before each), max over ranks: a step is as slow as its slowest rank.
- :func:`measure_peak_bytes`: the process's heap in use (glibc ``mallinfo2``: arenas plus
  mmapped blocks, so the gloo threads' buffers count too) sampled after every node of one run,
  minus what was in use before it, plus the inputs' bytes. CPU torch has no allocator
  statistics, and this build's profiler loses allocation events, so this is the measurement;
  it misses temporaries a kernel allocates and frees inside one node.
- :func:`strip_comm`: the same graph with every collective replaced by a local op of the same
  output shape (a copy), so ``step - compute-only step`` is the exposed communication.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx

from rota.jobkit.overlap.capture import collective_kind, is_wait, run_graph

__all__ = ["heap_in_use", "measure_peak_bytes", "strip_comm", "time_step", "time_steps"]

aten = torch.ops.aten


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc: Any = None


def heap_in_use() -> int:
    """Bytes the process holds from malloc (small blocks in use plus mmapped blocks)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6")
        _libc.mallinfo2.restype = _MallInfo2
    info = _libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def time_step(module: Callable[..., Any], inputs: Sequence[torch.Tensor], group: dist.ProcessGroup | None,
              iters: int = 10, warmup: int = 2) -> float:
    """Median step time of ``module`` (a graph or any callable of the inputs), max over ranks."""
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    samples = []
    for i in range(warmup + iters):
        if group is not None:
            dist.barrier(group)
        start = time.perf_counter()
        run_graph(module, inputs)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    median = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(median, op=dist.ReduceOp.MAX, group=group)
    return float(median.item())


def time_steps(variants: Mapping[str, Callable[..., Any]], inputs: Sequence[torch.Tensor],
               group: dist.ProcessGroup | None, iters: int = 10, warmup: int = 2) -> dict[str, float]:
    """Median step time of each variant, measured in interleaved rounds (max over ranks).

    One step of every variant per round, so a change in the machine's load during the
    measurement (other processes on shared cores) falls on all variants alike.
    """
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + iters):
        for name, module in variants.items():
            if group is not None:
                dist.barrier(group)
            start = time.perf_counter()
            run_graph(module, inputs)
            if i >= warmup:
                samples[name].append(time.perf_counter() - start)
    medians = torch.tensor([statistics.median(samples[n]) for n in variants], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(variants, medians.tolist(), strict=True))


class _HeapSampler(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.peak = 0

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.peak = max(self.peak, heap_in_use())
        return out


def measure_peak_bytes(module: fx.GraphModule, inputs: Sequence[torch.Tensor], group: dist.ProcessGroup | None,
                       repeats: int = 2) -> int:
    """Peak heap in use during one step (max over ``repeats`` runs and over ranks)."""
    input_bytes = sum(x.untyped_storage().nbytes() for x in inputs)
    peaks = []
    for _ in range(repeats):
        if group is not None:
            dist.barrier(group)
        sampler = _HeapSampler(module)
        before = heap_in_use()
        sampler.run(*inputs)
        peaks.append(max(0, sampler.peak - before) + input_bytes)
    peak = torch.tensor([max(peaks)], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    return int(peak.item())


def strip_comm(module: fx.GraphModule) -> fx.GraphModule:
    """A compute-only twin: collectives become local copies of the right shape, waits vanish."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in module.graph.nodes:
        kind = collective_kind(node)
        if is_wait(node):
            env[node] = env[node.args[0]]  # type: ignore[index]
            continue
        if kind is None:
            env[node] = graph.node_copy(node, lambda n: env[n])
            continue
        x = env[node.args[0]]  # type: ignore[index]
        if kind == "all_gather_into_tensor":
            env[node] = graph.call_function(_local_all_gather, (x, node.args[1]))
        elif kind == "reduce_scatter_tensor":
            env[node] = graph.call_function(_local_reduce_scatter, (x, node.args[2]))
        else:
            env[node] = graph.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    out = fx.GraphModule(module, graph)
    out.recompile()
    return out



def _local_all_gather(x: torch.Tensor, ranks: int) -> torch.Tensor:
    return torch.cat([x] * ranks)


def _local_reduce_scatter(x: torch.Tensor, ranks: int) -> torch.Tensor:
    return x[: x.shape[0] // ranks].contiguous().clone()
