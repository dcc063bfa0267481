"""One live re-plan, end to end and pure: snapshot -> scenario -> policy -> step-0 decision.

The loop calls this in a worker thread; tests call it directly with plain data.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rota.allocator import policies, policy_fair
from rota.allocator.grid import Grid
from rota.allocator.liveplan import (
    Horizon,
    LiveJob,
    LiveNode,
    LiveScenario,
    StepDecision,
    build,
    decide,
    figures,
)
from rota.ledger.fairness import FairnessConfig
from rota.ledger.twostage import JobView, TenantState


@dataclass(frozen=True)
class FairInputs:
    """The ledger's standings, for the `fair` policy: stage 1 (tenants) and stage 2 (jobs)."""

    tenants: dict[str, TenantState]
    jobs: dict[str, JobView]
    config: FairnessConfig = field(default_factory=FairnessConfig)


@dataclass
class PlanOutcome:
    live: LiveScenario
    plan_grid: Grid
    decision: StepDecision
    policy: str
    runtime_ms: float
    figures: dict[str, float | int] = field(default_factory=dict)
    stats: dict[str, float | int | str] = field(default_factory=dict)
    yields: list[policy_fair.Yield] = field(default_factory=list)


def plan_live(
    nodes: Sequence[LiveNode], jobs: Sequence[LiveJob], horizon: Horizon, policy: str, full_time_limit_s: float = 10.0,
    fair: FairInputs | None = None, held_back: Mapping[str, str] | None = None,
) -> PlanOutcome:
    started = time.perf_counter()
    live = build(nodes, jobs, horizon, held_back)
    if policy == "fair" and fair is not None:
        plan = policy_fair.plan(live.scenario, fair.tenants, horizon.now_s, jobs=fair.jobs, cfg=fair.config)
    else:
        plan = policies.get(policy, full_time_limit=full_time_limit_s)(live.scenario)
    runtime_ms = (time.perf_counter() - started) * 1000
    decision = decide(live, plan.grid)
    stats = {k: v for k, v in plan.stats.items() if k in ("gap", "bound", "status")}
    outcome = PlanOutcome(live, plan.grid, decision, policy, runtime_ms, figures(live, plan.grid), stats)
    if policy == "fair" and fair is not None:
        outcome.yields = _lease_yields(live, plan.grid, decision, horizon, fair)
    return outcome


def _lease_yields(live: LiveScenario, grid: Grid, decision: StepDecision, horizon: Horizon, fair: FairInputs) -> list[policy_fair.Yield]:
    """At lease expiry, over-share tenants' restartable jobs yield to under-served waiting ones."""
    now = horizon.now_s
    leases = [
        policy_fair.Lease(j.id, j.tenant, len(j.gpu_indices), now - j.elapsed_s, j.preemptible, j.restart, node=j.node or "")
        for j in live.jobs.values() if j.node is not None and not j.realtime
    ]
    waiting = [fair.jobs[i] for i in decision.waiting if i in fair.jobs and live.jobs[i].node is None]
    free_now = sum(1 for g, row in enumerate(grid) if row[0] is None and live.layout.where(g) is not None)

    def one_node(job: JobView, picked: Sequence[policy_fair.Lease]) -> bool:
        # A job runs on one node: GPUs freed on several nodes would not make its block.
        return len({lease.node for lease in picked}) <= 1

    return policy_fair.lease_yields(leases, waiting, fair.tenants, free_now, now, fair.config, fits=one_node)
