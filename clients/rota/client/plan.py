"""The allocator's plan as SDK values: the live cluster's current step, and scenario plans."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from rota.client import _wire
from rota.client.enums import JobKind
from rota.v1 import allocator_pb2


@dataclass(frozen=True)
class PlannedJob:
    job_id: str
    tenant: str
    kind: JobKind
    node: str
    gpus: list[int]
    start_step: int  # -1: already running; 0: starts now; k: planned at step k; -2: not in the plan
    planned_seconds: float
    nodes: list[str] = field(default_factory=list)  # a gang: all its nodes (node is nodes[0])


@dataclass(frozen=True)
class CurrentPlan:
    """The latest committed step of the live plan. Cells are job ids, "" idle, "*" another tenant's."""

    epoch: int
    created_at: datetime | None
    policy: str
    trigger: str
    step_seconds: float
    horizon: int
    gpu_labels: list[str]
    grid: list[list[str]]
    jobs: list[PlannedJob]
    figures: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def _from_proto(p: allocator_pb2.CurrentPlanResponse) -> CurrentPlan:
        return CurrentPlan(
            epoch=p.epoch,
            created_at=p.created_at.ToDatetime().replace(tzinfo=None) if p.HasField("created_at") else None,
            policy=p.policy, trigger=p.trigger, step_seconds=p.step_seconds, horizon=p.horizon,
            gpu_labels=list(p.gpu_labels), grid=[list(r.cells) for r in p.grid],
            jobs=[PlannedJob(j.job_id, j.tenant, _wire.job_kind(j.job_kind),
                             j.node, list(j.gpus), j.start_step, j.planned_seconds, list(j.nodes))
                  for j in p.jobs],
            figures={
                "utilization": p.utilization, "value": p.value, "realtime_unmet": p.realtime_unmet,
                "completed": p.completed, "objective": p.objective, "runtime_ms": p.runtime_ms, "gap": p.gap,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["created_at"] = self.created_at.isoformat() + "Z" if self.created_at else None
        return out


@dataclass(frozen=True)
class ScenarioPlan:
    grid: list[list[str]]
    figures: dict[str, float]

    @staticmethod
    def _from_proto(p: allocator_pb2.PlanResponse) -> ScenarioPlan:
        return ScenarioPlan(
            grid=[list(r.cells) for r in p.grid],
            figures={
                "utilization": p.utilization, "value": p.value, "realtime_unmet": p.realtime_unmet,
                "completed": p.completed, "objective": p.objective, "bound": p.bound, "gap": p.gap,
                "runtime_ms": p.runtime_ms,
            },
        )


@dataclass(frozen=True)
class WhatIf:
    """When a job would start if submitted now (nothing is submitted)."""

    start_step: int  # 0 now, k at plan step k, -1 not within the horizon
    expected_start_seconds: float  # -1 when not within the horizon
    reason: str

    def text(self) -> str:
        if self.start_step == 0:
            return "it would start now"
        if self.start_step < 0:
            return f"not within the plan: {self.reason}"
        return f"it would start in ~{self.expected_start_seconds:.0f}s (plan step {self.start_step}): {self.reason}"


@dataclass(frozen=True)
class Explanation:
    """Why a job waits or runs where it does, and the duration it was planned on beside its run time."""

    job_id: str
    reason: str
    planned_seconds: float  # 0: unknown (it holds its GPUs through the horizon)
    declared_seconds: float
    model: str  # the forecaster's model, or "declared" ("" before the first plan)
    p50_seconds: float
    p90_seconds: float
    actual_seconds: float  # so far while it runs; 0 before it starts

    @staticmethod
    def _from_proto(p: allocator_pb2.ExplainResponse) -> Explanation:
        return Explanation(p.job_id, p.reason, p.planned_seconds, p.declared_seconds, p.model, p.p50_seconds,
                           p.p90_seconds, p.actual_seconds)

    def duration_text(self) -> str:
        def human(seconds: float) -> str:
            return f"{seconds / 60:.1f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"

        planned = human(self.planned_seconds) if self.planned_seconds else "unknown"
        source = f"forecast by {self.model}, P50 {human(self.p50_seconds)}, P90 {human(self.p90_seconds)}" if (
            self.model and self.model != "declared") else "declared"
        actual = human(self.actual_seconds) if self.actual_seconds else "-"
        return f"planned {planned} ({source}); actual {actual}"
