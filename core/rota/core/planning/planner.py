"""One live re-plan, end to end and pure: snapshot -> scenario -> policy -> step-0 decision.

The loop calls this in a worker thread; tests call it directly with plain data.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.quotas import Quota
from rota.core.fairness.twostage import JobView, TenantState
from rota.core.planning import policies, policy_fair, policy_fast, quota_step, resources
from rota.core.planning.grid import Grid
from rota.core.planning.liveplan import (
    Horizon,
    LiveJob,
    LiveNode,
    LiveScenario,
    StepDecision,
    build,
    decide,
    figures,
    gang_shape,
)
from rota.core.planning.moves import (
    MAX_PREEMPTION_CANDIDATES,
    Migration,
    MoveInputs,
    Preemption,
    pin_targets,
    price_preemptions,
    repair_fragmentation,
)


@dataclass(frozen=True)
class FairInputs:
    """The ledger's standings: `fair`'s stage 1 (tenants) and stage 2 (jobs); `fast` reads
    the tenants' to interleave its queue across tenants by standing."""

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
    preemption: Preemption | None = None  # a started job to pause and requeue for higher-value work
    migrations: list[Migration] = field(default_factory=list)  # moves that free an aligned block
    reclaims: list[Preemption] = field(default_factory=list)  # borrowers paused for a tenant's guarantee


PRICED = ("fast", "full")  # the policies that price preemption (fifo never preempts; fair yields leases)


def plan_live(
    nodes: Sequence[LiveNode], jobs: Sequence[LiveJob], horizon: Horizon, policy: str, full_time_limit_s: float = 10.0,
    fair: FairInputs | None = None, held_back: Mapping[str, str] | None = None, moves: MoveInputs | None = None,
    quotas: Mapping[str, Quota] | None = None,
) -> PlanOutcome:
    started = time.perf_counter()
    moves = moves or MoveInputs()
    # 1. Jobs resumed or migrated to a node are placed there first; the policy plans around them.
    targets = {j: n for j, n in moves.targets.items() if not held_back or j not in held_back}
    jobs, pinned, pinned_waiting = pin_targets(nodes, jobs, targets)
    held_back = {**(held_back or {}), **pinned_waiting}  # no room on its node: it waits, not elsewhere
    held_back = {**resources.unfit_anywhere(nodes, jobs), **held_back}  # no node has its CPUs or memory
    if quotas:  # a job over its tenant's limit waits out of the plan; jobs within a guarantee are not moved
        held = quota_step.hold(quotas, nodes, jobs, held_back, moves)
        jobs, held_back = held.jobs, {**held_back, **held.held_back}
        fair = replace(fair, jobs={k: v for k, v in fair.jobs.items() if k not in held.held_back}) if fair else None
        moves = quota_step.protected(quotas, nodes, jobs, moves)

    def solve(these: Sequence[LiveJob]) -> tuple[LiveScenario, Grid, float, dict[str, float | int | str]]:
        live = build(nodes, these, horizon, held_back)
        if policy == "fair" and fair is not None:
            plan = policy_fair.plan(live.scenario, fair.tenants, horizon.now_s, jobs=fair.jobs, cfg=fair.config)
        elif policy == "fast" and fair is not None:
            plan = policy_fast.plan(live.scenario, standings=fair.tenants, cfg=fair.config)
        else:
            plan = policies.get(policy, full_time_limit=full_time_limit_s)(live.scenario)
        return live, plan.grid, float(figures(live, plan.grid)["objective"]), plan.stats

    # 2. The policy plans the horizon; step 0 becomes the decision.
    live, grid, objective, plan_stats = solve(jobs)
    runtime_ms = (time.perf_counter() - started) * 1000
    decision = decide(live, grid)
    decision.starts[:0] = pinned
    resources.hold_unfit(nodes, live.jobs, decision)  # the GPU plan's starts, where CPUs and memory fit
    stats = {k: v for k, v in plan_stats.items() if k in ("gap", "bound", "status")}
    outcome = PlanOutcome(live, grid, decision, policy, runtime_ms, figures(live, grid), stats)
    # 3. Moves of started jobs: borrowers reclaimed for a tenant's guarantee first; else lease
    #    yields under `fair`; else a migration that repairs fragmentation (the moved job loses
    #    only its move), else a priced preemption under `fast` and `full`. FIFO moves nothing.
    if quotas and policy != "fifo":
        outcome.reclaims = quota_step.reclaim(quotas, live, grid, decision, held_back, moves, horizon.now_s)
        if outcome.reclaims:
            return outcome
    if policy == "fair" and fair is not None:
        outcome.yields = _lease_yields(live, grid, decision, horizon, fair, moves)
    if not outcome.yields and policy != "fifo" and moves.costs:
        outcome.migrations = repair_fragmentation(live, grid, decision, horizon, moves)
        if not outcome.migrations and policy in PRICED:
            outcome.preemption = price_preemptions(
                jobs, horizon, lambda these: solve(these)[:3], (live, grid, objective), decision, moves,
                limit=1 if policy == "full" else MAX_PREEMPTION_CANDIDATES)  # a CP-SAT solve each
    return outcome


def _lease_yields(
    live: LiveScenario, grid: Grid, decision: StepDecision, horizon: Horizon, fair: FairInputs, moves: MoveInputs,
) -> list[policy_fair.Yield]:
    """At lease expiry, over-share tenants' preemptible jobs yield to under-served waiting
    ones: paused when they have an image (the loop pauses them), else restarted."""
    now = horizon.now_s
    tenants = _promised(live, fair.tenants, moves)
    leases = [
        policy_fair.Lease(j.id, j.tenant, j.held_gpus, now - j.elapsed_s, j.preemptible, j.restart, node=j.node or "",
                          pausable=j.id in moves.costs, used=fair.jobs[j.id].used if j.id in fair.jobs else 0.0)
        for j in live.jobs.values() if j.node is not None and not j.realtime and j.id not in moves.busy
    ]
    promised = set(moves.yielded_to.values())  # already given GPUs by an earlier cycle's yields
    waiting = [fair.jobs[i] for i in decision.waiting
               if i in fair.jobs and live.jobs[i].node is None and i not in promised]
    free_now = sum(1 for g, row in enumerate(grid) if row[0] is None and live.layout.where(g) is not None)

    def fits(job: JobView, picked: Sequence[policy_fair.Lease]) -> bool:
        # A job runs on one node: GPUs freed on several nodes would not make its block. A
        # gang of k nodes runs on k whole nodes, so GPUs freed on up to k of them may.
        waiting_job = live.jobs.get(job.id)
        nodes = gang_shape(waiting_job, live.layout.slot)[0] if waiting_job is not None else 1
        return len({lease.node for lease in picked}) <= nodes

    # Forecast or declared remaining time of each waiting job (for short bursts): its
    # duration less the time it has held GPUs; unknown durations make no burst.
    left_s: dict[str, float] = {}
    for j in waiting:
        duration = live.jobs[j.id].duration_s
        if duration is not None:
            left_s[j.id] = duration - j.used / max(1, j.gpus)
    return policy_fair.lease_yields(leases, waiting, tenants, free_now, now, fair.config, fits=fits, left_s=left_s)


def _promised(live: LiveScenario, tenants: Mapping[str, TenantState], moves: MoveInputs) -> dict[str, TenantState]:
    """The tenants' holdings as the yields of earlier cycles left them: a job still pausing
    holds GPUs already given away, and the job they went to holds them though it has not
    started. Counted as held now, a tenant's queue would take a second borrower's GPUs for
    the same want (and the borrower lose more than its excess) while a pause is under way."""
    out = {t: replace(st) for t, st in tenants.items()}
    for moved, to in moves.yielded_to.items():
        gone, taker = live.jobs.get(moved), live.jobs.get(to)
        if gone is not None and gone.node is not None and moved in moves.busy and gone.tenant in out:
            out[gone.tenant].allocated -= gone.held_gpus
        if taker is not None and taker.node is None and taker.tenant in out:
            out[taker.tenant].allocated += taker.gpus
    return out
