"""Bucketing: merge collectives of different tiles into one (pack, one collective, unpack).

Which collectives merge is the simulator's DP (:func:`rota.jobkit.overlap.simulator.choose_buckets`);
this module rewrites the graph for a chosen set of buckets. The merged collective is issued
where the bucket's last member was issued and waited on where its first member was waited
on. Packing flattens each member's input; for a reduce-scatter or an all-to-all the flat
input is laid out rank-major (``[ranks, -1]`` per member, concatenated along dim 1) so the
merged collective sends each rank exactly the members' pieces it would have received. Every
rewrite is exact: it moves bytes, it never changes arithmetic.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from rota.jobkit.overlap.capture import COLLECTIVE_KINDS, WAIT, collective_kind, is_wait

__all__ = ["UNPACK_COPIES", "bucket", "bucket_by_slot"]

aten = torch.ops.aten

#: Kinds whose merged result splits back into members only by a copy (a strided gather).
UNPACK_COPIES = frozenset({"all_gather_into_tensor", "all_to_all_single"})


def _shape(node: fx.Node) -> list[int]:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"bucket: node {node.name} has no traced shape")
    return [int(s) for s in val.shape]


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _ranks(node: fx.Node, kind: str) -> int:
    if kind == "all_reduce":
        return 1
    if kind == "all_to_all_single":
        return len(node.args[1])  # type: ignore[arg-type]
    return int(node.args[1] if kind == "all_gather_into_tensor" else node.args[2])  # type: ignore[call-overload, arg-type]


def _emit_issue(graph: fx.Graph, members: list[fx.Node], env: dict[fx.Node, fx.Node], kind: str) -> fx.Node:
    first = members[0]
    ranks = _ranks(first, kind)
    inputs = [env[m.args[0]] for m in members]  # type: ignore[index]
    if kind in ("all_reduce", "all_gather_into_tensor"):
        flats = [graph.call_function(aten.reshape.default, (x, [-1])) for x in inputs]
        packed = graph.call_function(aten.cat.default, (flats,))
    else:
        rows = [graph.call_function(aten.reshape.default, (x, [ranks, -1])) for x in inputs]
        packed = graph.call_function(aten.reshape.default, (graph.call_function(aten.cat.default, (rows, 1)), [-1]))
    target = COLLECTIVE_KINDS[kind]
    if kind == "all_reduce":
        args: tuple[object, ...] = (packed, first.args[1], first.args[2])
    elif kind == "all_gather_into_tensor":
        args = (packed, first.args[1], first.args[2])
    elif kind == "reduce_scatter_tensor":
        args = (packed, first.args[1], first.args[2], first.args[3])
    else:
        total = sum(_numel(_shape(m)) for m in members) // ranks
        args = (packed, [total] * ranks, [total] * ranks, first.args[3])
    return graph.call_function(target, args)  # type: ignore[arg-type]


def _emit_unpack(graph: fx.Graph, merged_wait: fx.Node, members: list[fx.Node], kind: str) -> list[fx.Node]:
    ranks = _ranks(members[0], kind)
    shapes = [_shape(m) for m in members]
    sizes = [_numel(s) for s in shapes]
    if kind in ("all_reduce", "reduce_scatter_tensor"):
        parts = graph.call_function(aten.split_with_sizes.default, (merged_wait, sizes))
    else:
        grid = graph.call_function(aten.reshape.default, (merged_wait, [ranks, -1]))
        parts = graph.call_function(aten.split_with_sizes.default, (grid, [s // ranks for s in sizes], 1))
    out = [graph.call_function(aten.reshape.default, (graph.call_function(operator.getitem, (parts, i)), shape))
           for i, shape in enumerate(shapes)]
    if kind in UNPACK_COPIES:  # a member's rows are strided in the merged result; later views need them dense
        out = [graph.call_function(aten.clone.default, (o,), {"memory_format": torch.contiguous_format}) for o in out]
    return out


def _check_equal_splits(node: fx.Node) -> None:
    outs, ins = node.args[1], node.args[2]
    if not isinstance(outs, list | tuple) or not isinstance(ins, list | tuple) or len(set(outs)) != 1 or \
            list(outs) != list(ins):
        raise ValueError(f"bucket: all_to_all_single {node.name} has unequal split sizes; it cannot merge")


def bucket(module: fx.GraphModule, buckets: Sequence[Sequence[str]]) -> fx.GraphModule:
    """``module`` with each bucket (names of two or more collective nodes) merged into one."""
    nodes = {n.name: n for n in module.graph.nodes}
    position = {n: i for i, n in enumerate(module.graph.nodes)}
    member_of: dict[fx.Node, int] = {}
    groups: list[list[fx.Node]] = []
    waits: dict[fx.Node, fx.Node] = {}
    for b, names in enumerate(buckets):
        if len(names) < 2:
            continue
        members = _bucket_members(b, names, nodes, member_of, waits)
        members.sort(key=position.__getitem__)
        if min(position[waits[m]] for m in members) < position[members[-1]]:
            raise ValueError(f"bucket {b}: a member is waited on before the last member is issued")
        for m in members:
            member_of[m] = len(groups)
        groups.append(members)
    return _rebuild(module, groups, member_of, waits)


def _bucket_members(b: int, names: Sequence[str], nodes: dict[str, fx.Node], member_of: dict[fx.Node, int],
                    waits: dict[fx.Node, fx.Node]) -> list[fx.Node]:
    """Bucket b's collectives, checked mergeable: each read only by its one wait (recorded in
    `waits`), in no other bucket, all of one kind (all_to_all_single: of equal splits)."""
    members = []
    for name in names:
        node = nodes.get(name)
        if node is None or collective_kind(node) is None:
            raise ValueError(f"bucket {b}: {name!r} is not a collective of the graph")
        users = list(node.users)
        if len(users) != 1 or not is_wait(users[0]):
            raise ValueError(f"bucket {b}: collective {name} is read by something other than its one wait")
        if node in member_of:
            raise ValueError(f"bucket {b}: collective {name} is already in bucket {member_of[node]}")
        waits[node] = users[0]
        members.append(node)
    kinds = {collective_kind(m) for m in members}
    if len(kinds) != 1:
        raise ValueError(f"bucket {b}: collectives of different kinds {sorted(map(str, kinds))}")
    if "all_to_all_single" in kinds:
        for m in members:
            _check_equal_splits(m)
    return members


def _rebuild(module: fx.GraphModule, groups: list[list[fx.Node]], member_of: dict[fx.Node, int],
             waits: dict[fx.Node, fx.Node]) -> fx.GraphModule:
    """The graph copied with each group issued once, at its last member, and unpacked at its first wait."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    wait_member = {w: m for m, w in waits.items()}
    merged: dict[int, fx.Node] = {}
    for node in module.graph.nodes:
        if node in member_of:
            g = member_of[node]
            if node is groups[g][-1]:
                merged[g] = _emit_issue(graph, groups[g], env, str(collective_kind(node)))
            continue
        if node in wait_member:
            g = member_of[wait_member[node]]
            if g in merged and groups[g][0] not in env:
                merged_wait = graph.call_function(WAIT, (merged[g],))  # type: ignore[arg-type]
                kind = str(collective_kind(groups[g][0]))
                for m, part in zip(groups[g], _emit_unpack(graph, merged_wait, groups[g], kind), strict=True):
                    env[m] = part
                    env[waits[m]] = part
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    out = fx.GraphModule(module, graph)
    out.recompile()
    return out


def bucket_by_slot(module: fx.GraphModule) -> list[tuple[str, ...]]:
    """Buckets of the j-th collective of every tile stream, for each j (a full bucketing).

    Only slots whose members agree on kind are returned; this is the bucketing the DP may
    choose at most, used to check the rewrite and as the bench's 'merge everything' point.
    """
    per_stream: dict[int, list[fx.Node]] = {}
    for node in module.graph.nodes:
        if collective_kind(node) is not None and node.meta.get("rota_stream") is not None:
            per_stream.setdefault(int(node.meta["rota_stream"]), []).append(node)
    streams = [per_stream[s] for s in sorted(per_stream)]
    if len(streams) < 2:
        return []
    out = []
    for j in range(min(len(s) for s in streams)):
        slot = [s[j] for s in streams]
        if len({collective_kind(n) for n in slot}) == 1:
            out.append(tuple(n.name for n in slot))
    return out
