"""Tenant quotas in a live re-plan (pure): who is held by a limit, and which borrowers to reclaim.

`plan_live` calls `hold` before the policy (a job whose start would take its tenant, or an
ancestor, past a limit stays out of the plan with the reason `rota explain` shows; a
per-type limit narrows the types it may take) and `reclaim` after it (waiting jobs within
their tenant's guarantee that found no room get borrowers' jobs paused for them, each a
`Preemption` the loop starts through the checkpoint coordinator). Both the `fast` and the
`fair` policy plan around what `hold` leaves; the rules are `rota.core.fairness.quotas`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rota.core.fairness.quotas import Asking, Holding, Quota, Usage, admit, reclaims
from rota.core.planning.grid import Grid
from rota.core.planning.liveplan import LiveJob, LiveNode, LiveScenario, StepDecision, gang_shape
from rota.core.planning.moves import MoveInputs, Preemption


@dataclass
class Held:
    jobs: list[LiveJob]  # every job, a narrowed one with the types it may still take
    held_back: dict[str, str] = field(default_factory=dict)  # job -> its quota reason


def holdings(nodes: Sequence[LiveNode], jobs: Sequence[LiveJob], moves: MoveInputs, now_s: float = 0.0) -> list[Holding]:
    types = {n.name: n.gpu_type for n in nodes}
    return [
        Holding(j.id, j.tenant, j.held_gpus, types.get(j.node or "", ""), j.node or "",
                movable=j.preemptible and not j.realtime and j.id in moves.costs and j.id not in moves.busy,
                cost_s=moves.costs[j.id].seconds if j.id in moves.costs else 0.0, started_s=now_s - j.elapsed_s)
        for j in jobs if j.node is not None
    ]


def hold(quotas: Mapping[str, Quota], nodes: Sequence[LiveNode], jobs: Sequence[LiveJob],
         held_back: Mapping[str, str], moves: MoveInputs) -> Held:
    """The waiting jobs, highest priority first then in arrival order, admitted within limits."""
    queue = [j for j in jobs if j.node is None and j.id not in held_back]
    order = sorted(range(len(queue)), key=lambda i: (-queue[i].priority, i))
    asking = [Asking(queue[i].id, queue[i].tenant, queue[i].gpus, frozenset(queue[i].gpu_types),
                     queue[i].preemptible) for i in order]
    types = {n.gpu_type for n in nodes if n.gpu_type}
    out = admit(quotas, holdings(nodes, jobs, moves), asking, types)
    narrowed = [replace(j, gpu_types=tuple(sorted(out.narrowed[j.id]))) if j.id in out.narrowed else j for j in jobs]
    return Held(narrowed, out.held)


def reclaim(quotas: Mapping[str, Quota], live: LiveScenario, grid: Grid, decision: StepDecision,
            held_back: Mapping[str, str], moves: MoveInputs, now_s: float) -> list[Preemption]:
    """Borrowers' jobs to pause for the waiting jobs within their tenants' guarantees."""
    jobs = list(live.jobs.values())
    waiting = [j for j in jobs if j.node is None and j.id in decision.waiting and j.id not in held_back]
    if not waiting:
        return []
    free: dict[str, int] = {n.name: 0 for n in live.layout.nodes}
    for g, row in enumerate(grid):
        where = live.layout.where(g)
        if where is not None and row[0] is None:
            free[where[0]] += 1
    for j in jobs:  # a pause already under way frees its GPUs soon: not reclaimed twice
        if j.id in moves.busy and j.node is not None:
            free[j.node] = free.get(j.node, 0) + j.held_gpus
    order = sorted(range(len(waiting)), key=lambda i: (-waiting[i].priority, i))
    asking = [Asking(waiting[i].id, waiting[i].tenant, waiting[i].gpus, frozenset(waiting[i].gpu_types),
                     waiting[i].preemptible) for i in order]
    by_id = {j.id: j for j in waiting}
    found = reclaims(quotas, holdings(live.layout.nodes, jobs, moves, now_s), asking, free,
                     gang_nodes=lambda a: gang_shape(by_id[a.job_id], live.layout.slot)[0])
    return [Preemption(r.job_id, live.jobs[r.job_id].node or "", r.for_job, float(r.gpus),
                       moves.costs[r.job_id].seconds if r.job_id in moves.costs else 0.0, r.reason) for r in found]


def protected(quotas: Mapping[str, Quota], nodes: Sequence[LiveNode], jobs: Sequence[LiveJob],
              moves: MoveInputs) -> MoveInputs:
    """The moves the priced preemption and the lease yields may make: never a job of a
    tenant within its guarantee (it would be reclaimed straight back)."""
    usage = Usage(quotas, holdings(nodes, jobs, moves))
    keep = {j.id for j in jobs if j.node is not None and (q := quotas.get(j.tenant)) is not None
            and q.guaranteed > 0 and usage.borrowed(j.tenant) == 0}
    if not keep:
        return moves
    return replace(moves, costs={k: v for k, v in moves.costs.items() if k not in keep})
