"""`rota up --gpu-types a100:2,h100:1 --topology s1:2,s2:1`: what each virtual node of a
local cluster declares, as runs of VALUE:NODES in node order (node-1, node-2, ...).

Either flag also says how many nodes there are; with --nodes too, or with both, the counts
must agree: a silent truncation or padding would start a cluster other than the one asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from rota.core.nodelabels import MAX_LABEL_LENGTH, type_problem, word_problem

DEFAULT_NODES = 2


@dataclass(frozen=True)
class NodeLayout:
    count: int
    gpu_types: list[str]  # one a node; "" when --gpu-types is not given
    switches: list[str]  # one a node; "" when --topology is not given


def parse_runs(text: str, flag: str, what: str) -> list[str]:
    """"a100:2,h100:1" -> ["a100", "a100", "h100"]; ValueError naming `flag` otherwise."""
    values: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        value, sep, count = part.rpartition(":")
        if not sep or not value:
            raise ValueError(f"{flag}: {part!r} is not {what}:NODES (e.g. {flag} {_example(flag)})")
        try:
            n = int(count)
        except ValueError:
            raise ValueError(f"{flag}: {part!r}: NODES must be a whole number, got {count!r}") from None
        if n < 1:
            raise ValueError(f"{flag}: {part!r}: NODES must be at least 1")
        problem = type_problem(value) if what == "TYPE" else word_problem(value, MAX_LABEL_LENGTH)
        if problem is not None:
            raise ValueError(f"{flag}: {value!r}: {problem}")
        values += [value] * n
    return values


def _example(flag: str) -> str:
    return "a100:2,h100:1" if flag == "--gpu-types" else "s1:2,s2:2"


def node_layout(nodes: int | None, gpu_types: str = "", topology: str = "") -> NodeLayout:
    """The nodes' count and declarations from --nodes, --gpu-types and --topology."""
    counts: dict[str, int] = {} if nodes is None else {"--nodes": nodes}
    types = parse_runs(gpu_types, "--gpu-types", "TYPE") if gpu_types else []
    switches = parse_runs(topology, "--topology", "SWITCH") if topology else []
    if gpu_types:
        counts["--gpu-types"] = len(types)
    if topology:
        counts["--topology"] = len(switches)
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{flag} {n}" for flag, n in counts.items())
        raise ValueError(f"{' and '.join(counts)} disagree on the number of nodes ({said})")
    count = next(iter(counts.values()), DEFAULT_NODES)
    return NodeLayout(count, types or [""] * count, switches or [""] * count)
