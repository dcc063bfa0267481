"""What the allocator records on /metrics (the names are defined in rota.common.metrics).

Per re-plan: its time in the pure core by policy and trigger kind, its objective, the jobs
it left waiting, and per node the GPUs it holds back (free now, kept for a job it starts
later in the horizon rather than filled). Per move: preemptions, migrations, lease
yields. Per cycle: whether this replica leads.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from rota.common import metrics
from rota.core.planning.grid import Grid
from rota.core.planning.liveplan import RESERVED_PREFIX, LiveScenario, StepDecision
from rota.core.planning.planner import PlanOutcome

STEP_BEGAN = "step began at "


def step_trigger(step_index: int, step_s: float) -> str:
    """A new step's trigger as a reader takes it: the wall time (UTC) it began, not its
    absolute number (`step 59874907 began` says nothing to anyone)."""
    began = datetime.fromtimestamp(step_index * step_s, UTC)
    return f"{STEP_BEGAN}{began:%H:%M:%S} UTC"


def trigger_kind(trigger: str) -> str:
    """A bounded label for a cycle's trigger, whose text names jobs and nodes."""
    if "timer" in trigger:
        return "timer"
    if trigger.startswith("first plan"):
        return "leader"
    if trigger.startswith(STEP_BEGAN):
        return "step"
    return "change"


def held_back(live: LiveScenario, grid: Grid, decision: StepDecision) -> dict[str, int]:
    """Per node: GPUs free at step 0 that the plan gives, later in the horizon, to a job that
    waits for them now (its block is kept whole rather than backfilled)."""
    later = set(decision.planned_start)
    out: Counter[str] = Counter({n.name: 0 for n in live.layout.nodes})
    for g, row in enumerate(grid):
        place = live.layout.where(g)
        if place is None or not row or row[0] is not None:
            continue
        if any(c is not None and not c.startswith(RESERVED_PREFIX) and c in later for c in row[1:]):
            out[place[0]] += 1
    return dict(out)


def record_plan(outcome: PlanOutcome, trigger: str) -> None:
    metrics.PLAN_SECONDS.labels(policy=outcome.policy, trigger=trigger_kind(trigger)).observe(outcome.runtime_ms / 1000)
    objective = outcome.figures.get("objective")
    if objective is not None:
        metrics.PLAN_OBJECTIVE.labels(policy=outcome.policy).set(float(objective))
    metrics.PLAN_WAITING.set(len(outcome.decision.waiting))
    for node, count in held_back(outcome.live, outcome.plan_grid, outcome.decision).items():
        metrics.HELD_BACK.labels(node=node).set(count)
