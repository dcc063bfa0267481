"""Costs for the simulator, measured on this machine, and a graph's schedule as plain data.

- Op costs: :func:`profile_graph` runs the graph through a timing interpreter (every rank
  together, since the graph holds collectives) and keeps each node's median time, the bytes its
  output newly allocates and which input's storage it is a view of.
- Communication: :func:`calibrate_comm` times each collective kind at several sizes from
  issue to wait and fits ``alpha + beta * bytes`` by least squares; :func:`copy_cost` times a
  ``cat`` (what packing a bucket costs per byte).

Every measurement is max-reduced across ranks, so all ranks plan from the same numbers and
choose the same transformation (their collectives must match).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.fx as fx

from rota.jobkit.overlap.bucketing import UNPACK_COPIES
from rota.jobkit.overlap.capture import WAIT, collective_kind, is_wait
from rota.jobkit.overlap.simulator import CommModel, SimOp

__all__ = ["NodeProfile", "calibrate_comm", "copy_cost", "fit_alpha_beta", "profile_graph", "to_sim_ops"]

_c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class NodeProfile:
    cost_s: float
    out_bytes: int
    alias_of: str | None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class _Profiler(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.times: dict[str, list[float]] = {}
        self.facts: dict[str, tuple[int, str | None]] = {}

    def run_node(self, n: fx.Node) -> Any:
        start = time.perf_counter()
        out = super().run_node(n)
        self.times.setdefault(n.name, []).append(time.perf_counter() - start)
        if n.name not in self.facts:
            produced = {_storage(t) for t in _tensors(out)}
            alias = None
            for dep in n.all_input_nodes:
                if produced & {_storage(t) for t in _tensors(self.env.get(dep))}:
                    alias = dep.name
                    break
            self.facts[n.name] = (0 if alias else sum(b for _, b in produced), alias)
        return out


def profile_graph(module: fx.GraphModule, inputs: Sequence[torch.Tensor], group: dist.ProcessGroup | None,
                  repeats: int = 5) -> dict[str, NodeProfile]:
    """Median time, allocated bytes and aliasing of every node, max over ranks."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    profiler = _Profiler(module)
    profiler.run(*inputs)  # warm-up
    profiler.times.clear()
    for _ in range(repeats):
        if group is not None:
            dist.barrier(group)
        profiler.run(*inputs)
    names = [n.name for n in module.graph.nodes if n.name in profiler.times]
    # A collective's issue is a fixed launch cost; its outliers are other threads (this rank's own
    # gloo work, other processes) taking the core, so its cost is the fastest issue seen.
    kinds = {n.name: collective_kind(n) for n in module.graph.nodes}
    medians = torch.tensor([min(profiler.times[n]) if kinds[n] else statistics.median(profiler.times[n])
                            for n in names], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    return {n: NodeProfile(float(c), *profiler.facts[n]) for n, c in zip(names, medians.tolist(), strict=True)}


def _collective_key(node: fx.Node, kind: str) -> str | None:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    dtype = str(getattr(val, "dtype", "?"))
    params = [a for a in node.args[1:]]
    if kind == "all_to_all_single":
        outs, ins = node.args[1], node.args[2]
        if not isinstance(outs, list | tuple) or len(set(outs)) != 1 or list(outs) != list(ins):  # type: ignore[arg-type]
            return None
        params = [len(outs), node.args[3]]
    return "|".join([kind, dtype, *map(str, params)])


def to_sim_ops(module: fx.GraphModule, profile: dict[str, NodeProfile], comm: CommModel) -> tuple[list[SimOp], list[str]]:
    """``module``'s nodes, in order, as simulator ops with measured costs; and its output names."""
    ops: list[SimOp] = []
    outputs: list[str] = []
    for node in module.graph.nodes:
        if node.op == "output":
            outputs = [a.name for a in _flatten_nodes(node.args[0])]
            continue
        if node.name not in profile:
            raise ValueError(f"profile: no measurement for node {node.name} (profile the same graph)")
        p = profile[node.name]
        deps = tuple(d.name for d in node.all_input_nodes)
        stream = node.meta.get("rota_stream")
        kind = collective_kind(node)
        if node.op in ("placeholder", "get_attr"):
            ops.append(SimOp(node.name, "input", out_bytes=p.out_bytes))
        elif kind is not None:
            src = node.args[0]
            nbytes = profile[src.name].out_bytes if isinstance(src, fx.Node) else 0
            val = src.meta.get("val") if isinstance(src, fx.Node) else None
            if isinstance(val, torch.Tensor):
                nbytes = val.numel() * val.element_size()
            ops.append(SimOp(node.name, "issue", deps, cost_s=p.cost_s, comm_s=comm.time(kind, nbytes),
                             out_bytes=p.out_bytes, stream=stream, collective=_collective_key(node, kind),
                             comm_bytes=nbytes, unpack_copies=kind in UNPACK_COPIES))
        elif is_wait(node):
            ops.append(SimOp(node.name, "wait", deps, alias_of=deps[0], stream=stream))
        else:
            ops.append(SimOp(node.name, "compute", deps, cost_s=p.cost_s, out_bytes=p.out_bytes,
                             alias_of=p.alias_of, stream=stream))
    return ops, outputs


def _flatten_nodes(value: Any) -> list[fx.Node]:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _flatten_nodes(v)]
    return []


def _issue(kind: str, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    name = group.group_name
    ranks = dist.get_world_size(group)
    if kind == "all_reduce":
        return _c10d.all_reduce(x, "sum", name)
    if kind == "all_gather_into_tensor":
        return _c10d.all_gather_into_tensor(x, ranks, name)
    if kind == "reduce_scatter_tensor":
        return _c10d.reduce_scatter_tensor(x, "sum", ranks, name)
    if kind == "all_to_all_single":
        return _c10d.all_to_all_single(x, [x.shape[0] // ranks] * ranks, [x.shape[0] // ranks] * ranks, name)
    raise ValueError(f"collective kind {kind!r} is not known")


def fit_alpha_beta(sizes_bytes: Sequence[int], times_s: Sequence[float]) -> tuple[float, float]:
    """``alpha + beta * bytes`` through timed sizes, by least squares on *relative* error.

    A plain fit is ruled by the largest size: a few percent of its milliseconds moved the
    intercept by hundreds of microseconds (two calibrations of one all_reduce a minute apart
    gave alpha 171 and 2,364 us), which is the whole cost of the small messages a block
    sends. Weighting each residual by 1/time asks every size to fit to the same share."""
    if len(sizes_bytes) != len(times_s) or len(sizes_bytes) < 2:
        raise ValueError("fit_alpha_beta: needs a time for each of at least two sizes")
    weights = 1.0 / np.maximum(np.array(times_s, dtype=float), 1e-9)
    slope, intercept = np.polyfit(np.array(sizes_bytes, dtype=float), np.array(times_s, dtype=float), 1, w=weights)
    return max(0.0, float(intercept)), max(0.0, float(slope))


def calibrate_comm(group: dist.ProcessGroup, kinds: Sequence[str] = ("all_reduce", "all_gather_into_tensor",
                   "reduce_scatter_tensor", "all_to_all_single"), sizes_bytes: Sequence[int] = (
                   16 << 10, 256 << 10, 1 << 20, 4 << 20), repeats: int = 5, launch_s: float = 0.0) -> CommModel:
    """Fit ``alpha + beta * bytes`` per collective kind from timed collectives (max over ranks)."""
    ranks = dist.get_world_size(group)
    alpha: dict[str, float] = {}
    beta: dict[str, float] = {}
    for kind in kinds:
        times = []
        for size in sizes_bytes:
            x = torch.ones(max(ranks, size // 4 // ranks * ranks))
            samples = []
            for _ in range(repeats + 1):
                dist.barrier(group)
                start = time.perf_counter()
                WAIT(_issue(kind, x, group))
                samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples[1:]))
        measured = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=group)
        alpha[kind], beta[kind] = fit_alpha_beta(sizes_bytes, measured.tolist())
    copy = copy_cost(group)
    return CommModel(alpha, beta, copy_s_per_byte=copy, launch_s=launch_s)


def copy_cost(group: dist.ProcessGroup | None, nbytes: int = 4 << 20, repeats: int = 5) -> float:
    """Seconds per byte of a ``cat`` of two halves (max over ranks)."""
    halves = [torch.ones(nbytes // 8), torch.ones(nbytes // 8)]
    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.cat(halves)
        samples.append(time.perf_counter() - start)
    per_byte = torch.tensor([statistics.median(samples[1:]) / nbytes], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(per_byte, op=dist.ReduceOp.MAX, group=group)
    return float(per_byte.item())

