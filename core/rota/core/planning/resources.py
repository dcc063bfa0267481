"""CPUs and memory as resources of the plan, beside GPUs (pure).

A node reports what jobs may reserve on it (`LiveNode.cpus`, `.memory_bytes`; 0: not
reported, nothing is checked) and a job asks for `cpus` and `memory` on each node it holds
(its cgroup's limits, rota.agent.cgroups). The policies plan GPU rows; these two rules
keep the plan from placing a job where the rest does not fit:

- `unfit_anywhere`: a waiting job that no live node could hold even empty waits, held
  out of the plan with the reason (a node that fits may join);
- `hold_unfit`: step 0's starts, in order, each against what the node has left after the
  jobs holding it and the starts before; a start that does not fit is not made and waits
  with the reason, until the node frees enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rota.core.planning.liveplan import LiveJob, LiveNode, StepDecision
from rota.core.quantities import format_bytes

__all__ = ["Use", "hold_unfit", "in_use", "shortfall", "unfit_anywhere"]


@dataclass(frozen=True)
class Use:
    """CPUs and memory bytes reserved (or asked for) on one node."""

    cpus: float = 0.0
    memory_bytes: int = 0

    def __add__(self, other: Use) -> Use:
        return Use(self.cpus + other.cpus, self.memory_bytes + other.memory_bytes)


def _asks(job: LiveJob) -> Use:
    return Use(job.cpus, job.memory_bytes)


def shortfall(node: LiveNode, used: Use, ask: Use) -> str | None:
    """What `node` lacks for `ask` beside `used`, in words, or None when it fits (a
    capacity of 0 is not reported: that resource is not checked)."""
    lacks = []
    if node.cpus > 0 and ask.cpus > 0 and used.cpus + ask.cpus > node.cpus + 1e-9:
        lacks.append(f"{ask.cpus:g} CPUs ({max(0.0, node.cpus - used.cpus):g} of {node.cpus:g} free)")
    if node.memory_bytes > 0 and ask.memory_bytes > 0 and used.memory_bytes + ask.memory_bytes > node.memory_bytes:
        free = max(0, node.memory_bytes - used.memory_bytes)
        lacks.append(f"{format_bytes(ask.memory_bytes)} of memory ({format_bytes(free)} of "
                     f"{format_bytes(node.memory_bytes)} free)")
    return f"needs {' and '.join(lacks)} on {node.name}" if lacks else None


def in_use(jobs: Iterable[LiveJob]) -> dict[str, Use]:
    """Per node, what the jobs holding it reserve (a gang or an app on each of its nodes)."""
    used: dict[str, Use] = {}
    for job in jobs:
        for node in job.holding_nodes:
            used[node] = used.get(node, Use()) + _asks(job)
    return used


def unfit_anywhere(nodes: Sequence[LiveNode], jobs: Iterable[LiveJob]) -> dict[str, str]:
    """Waiting jobs that no live node could hold even when empty, each with the reason."""
    out: dict[str, str] = {}
    live = [n for n in nodes if n.gpus > 0]
    for job in jobs:
        if job.node is not None or (job.cpus <= 0 and job.memory_bytes <= 0) or not live:
            continue
        types = set(job.gpu_types)
        candidates = [n for n in live if not types or n.gpu_type in types] or live
        reasons = [shortfall(n, Use(), _asks(job)) for n in candidates]
        if all(reasons):
            out[job.id] = f"waiting: no live node has the CPUs or memory it asks for ({reasons[0]})"
    return out


def hold_unfit(nodes: Sequence[LiveNode], jobs: Mapping[str, LiveJob], decision: StepDecision) -> list[str]:
    """Takes out of `decision` the starts whose nodes lack the CPUs or memory they ask for
    (they wait with the reason); returns their ids."""
    by_name = {n.name: n for n in nodes}
    starting = {s.job_id for s in decision.starts}  # a job pinned to its target holds it already
    used = in_use(j for j in jobs.values() if j.id not in starting)
    held: list[str] = []
    kept = []
    for start in decision.starts:
        job = jobs.get(start.job_id)
        targets = start.nodes or tuple(n for n, _ in start.replicas) or (start.node,)
        ask = _asks(job) if job is not None else Use()
        why = next((w for n in targets if n in by_name
                    and (w := shortfall(by_name[n], used.get(n, Use()), ask)) is not None), None)
        if why is not None:
            decision.waiting[start.job_id] = f"waiting: {why}"
            held.append(start.job_id)
            continue
        for n in targets:
            used[n] = used.get(n, Use()) + ask
        kept.append(start)
    decision.starts[:] = kept
    return held
