"""AllocatorService adapter: Plan (a scenario, pure), CurrentPlan (the live plan), Explain,
and WhatIf (when a job would start if submitted now)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import grpc
from sqlalchemy.orm import Session

from rota.allocator import repository
from rota.allocator.models import PlanStepRow
from rota.cluster import planner_view, queries
from rota.cluster.job_lifecycle import get_job, utcnow
from rota.common import convert
from rota.common.auth import Identity, current_identity
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.models import TenantRow
from rota.core.array_status import TaskGroup, explain_array
from rota.core.errors import InvalidArgument, NotFound
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning import policies
from rota.core.planning.liveplan import Horizon
from rota.core.planning.metrics import measure
from rota.core.planning.planner import plan_live
from rota.core.planning.scenario import ScenarioError, from_dict
from rota.v1 import allocator_pb2, allocator_pb2_grpc, common_pb2

MAX_FULL_TIME_LIMIT_S = 60.0
OTHER_TENANT = "*"
# rota.cluster.job_lifecycle.new_job_id's shape, and an array task's (`j-0a1b2c3d4e_7`, rota.core.arrays);
# a trigger cut at its column's width may end in part of one.
JOB_ID_IN_TEXT = re.compile(r"\bj-[0-9a-z]+(?:_[0-9]+)?")
HIDDEN_JOB = "another tenant's job"  # a job id in a plan's trigger that is not the caller's


WHAT_IF_ID = "?what-if"  # never a real job id (those are j-<hex>)


class AllocatorService(allocator_pb2_grpc.AllocatorServiceServicer):
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    async def Plan(self, request: allocator_pb2.PlanRequest, context: grpc.aio.ServicerContext) -> allocator_pb2.PlanResponse:
        try:
            scenario = from_dict(json.loads(request.scenario_json or "null"))
        except json.JSONDecodeError as exc:
            raise InvalidArgument("scenario_json", f"not valid JSON ({exc.msg})") from None
        except ScenarioError as exc:
            raise InvalidArgument(f"scenario_json.{exc.field}", exc.reason) from None
        name = request.policy or "fast"
        if name not in policies.NAMES:
            raise InvalidArgument("policy", f"unknown policy {name!r}; one of {', '.join(policies.NAMES)}")
        limit = request.time_limit_seconds or 2.0
        if not 0 < limit <= MAX_FULL_TIME_LIMIT_S:
            raise InvalidArgument("time_limit_seconds", f"must be in (0, {MAX_FULL_TIME_LIMIT_S:g}]")
        started = time.perf_counter()
        plan = await asyncio.to_thread(policies.get(name, full_time_limit=limit), scenario)
        runtime_ms = (time.perf_counter() - started) * 1000
        m = measure(scenario, plan.grid)
        return allocator_pb2.PlanResponse(
            grid=[allocator_pb2.GridRow(cells=[c or "" for c in row]) for row in plan.grid],
            utilization=m.utilization, value=m.value, realtime_unmet=m.realtime_unmet, completed=m.completed,
            objective=m.objective, bound=float(plan.stats.get("bound", 0.0)), gap=float(plan.stats.get("gap", 0.0)),
            runtime_ms=runtime_ms,
        )

    async def CurrentPlan(
        self, request: allocator_pb2.CurrentPlanRequest, context: grpc.aio.ServicerContext
    ) -> allocator_pb2.CurrentPlanResponse:
        identity = current_identity()

        def read(session: Session) -> tuple[PlanStepRow | None, dict[str, str]]:
            row = repository.latest_plan_step(session)
            return row, ({} if row is None or identity.is_admin else queries.job_tenants(session, trigger_job_ids(row.trigger)))

        row, owners = await asyncio.to_thread(self.db.run, read)
        if row is None:
            raise NotFound("no plan yet: the allocator plans once a node has registered")
        return plan_step_to_proto(row, identity, owners)

    async def WhatIf(self, request: allocator_pb2.WhatIfRequest, context: grpc.aio.ServicerContext) -> allocator_pb2.WhatIfResponse:
        identity = current_identity()
        spec = _what_if_spec(request)
        spec.tenant = identity.tenant_for(spec.tenant, "ask")
        if not await asyncio.to_thread(self.db.run, lambda s: s.get(TenantRow, spec.tenant) is not None):
            raise InvalidArgument("tenant", f"unknown tenant {spec.tenant!r}")
        view = await asyncio.to_thread(self.db.run, planner_view.live_view)
        validate(spec, max_gpus_per_node=max((n.gpus for n in view.nodes), default=0))
        probe = planner_view.live_job(WHAT_IF_ID, spec.tenant, spec.kind, spec.priority, spec)
        horizon = Horizon(self.settings.plan_step_s, self.settings.plan_horizon, time.time())
        outcome = await asyncio.to_thread(plan_live, view.nodes, [*view.jobs, probe], horizon, "fast")
        if any(s.job_id == WHAT_IF_ID for s in outcome.decision.starts):
            return allocator_pb2.WhatIfResponse(expected_start_seconds=0, start_step=0, reason="it would start now")
        step = outcome.decision.planned_start.get(WHAT_IF_ID)
        reason = outcome.decision.waiting.get(WHAT_IF_ID, "").removeprefix("waiting: ")
        if step is None:
            return allocator_pb2.WhatIfResponse(expected_start_seconds=-1, start_step=-1, reason=reason)
        return allocator_pb2.WhatIfResponse(expected_start_seconds=step * horizon.step_s, start_step=step, reason=reason)

    async def Explain(self, request: allocator_pb2.ExplainRequest, context: grpc.aio.ServicerContext) -> allocator_pb2.ExplainResponse:
        identity = current_identity()
        job, fc = await asyncio.to_thread(
            self.db.run, lambda s: (get_job(s, request.job_id), repository.job_forecast(s, request.job_id))
        )
        if job is None:
            explained = await asyncio.to_thread(self.db.run, lambda s: _array_explanation(s, request.job_id, identity))
            if explained is not None:
                return allocator_pb2.ExplainResponse(job_id=request.job_id, reason=explained)
        if job is None or not identity.may_access(job.tenant):
            raise NotFound(f"job {request.job_id} not found")
        actual = 0.0
        if job.started_at is not None:
            actual = ((job.finished_at or utcnow()) - job.started_at).total_seconds()
        reply = allocator_pb2.ExplainResponse(job_id=job.id, reason=job.reason, actual_seconds=actual)
        if fc is not None:
            reply.planned_seconds, reply.declared_seconds = fc.planned_seconds or 0, fc.declared_seconds or 0
            reply.model, reply.p50_seconds, reply.p90_seconds = fc.model, fc.p50_seconds, fc.p90_seconds
        return reply


def _array_explanation(session: Session, array_id: str, identity: Identity) -> str | None:
    """An array's explanation (rota.core.array_status); None when no array the caller may
    see has that id (another tenant's reads as missing, as its jobs do)."""
    found = queries.array_tasks(session, array_id)
    if found is None or not identity.may_access(found[0].tenant):
        return None
    row, groups = found
    return explain_array(row.id, row.count, row.max_running,
                         [TaskGroup(state, reason, n, first) for state, reason, n, first in groups])


def trigger_job_ids(trigger: str | None) -> set[str]:
    """The job ids a plan's trigger names ("arrival of j-..., j-..._3")."""
    return set(JOB_ID_IN_TEXT.findall(trigger or ""))


def visible_trigger(trigger: str, identity: Identity, owners: dict[str, str]) -> str:
    """A plan's trigger as the caller may read it: the jobs it names that are the caller's
    by id, every other (another tenant's, one gone since, one cut by the column's width)
    as HIDDEN_JOB. `owners`: each named job's tenant, as the jobs table has it."""
    if identity.is_admin:
        return trigger

    def word(m: re.Match[str]) -> str:
        owner = owners.get(m.group(0))
        return m.group(0) if owner is not None and identity.may_access(owner) else HIDDEN_JOB

    return JOB_ID_IN_TEXT.sub(word, trigger)


def plan_step_to_proto(row: PlanStepRow, identity: Identity, owners: dict[str, str] | None = None) -> allocator_pb2.CurrentPlanResponse:
    """The stored step as the caller may see it: other tenants' job ids are masked, in the
    grid and the job list as OTHER_TENANT, in the trigger's words as HIDDEN_JOB (`owners`:
    the tenants of the jobs the trigger names)."""
    visible = {job_id for job_id, a in row.assignments.items() if identity.may_access(a.get("tenant", ""))}

    def cell(value: str) -> str:
        return value if not value or value in visible else OTHER_TENANT

    grid = [allocator_pb2.GridRow(cells=[cell(c) for c, n in runs for _ in range(n)]) for runs in row.grid["rows"]]
    figures: dict[str, Any] = row.figures
    trigger = visible_trigger(row.trigger or "", identity, owners or {})
    return allocator_pb2.CurrentPlanResponse(
        epoch=row.epoch, created_at=convert.timestamp(row.created_at), policy=row.policy, trigger=trigger,
        step_seconds=row.step_seconds, horizon=row.horizon, gpu_labels=list(row.grid["labels"]), grid=grid,
        jobs=[
            allocator_pb2.PlannedJob(
                job_id=job_id, tenant=a["tenant"], node=a.get("node", ""), gpus=a.get("gpus", []),
                job_kind=convert.KIND_VALUES.get(a["kind"], common_pb2.JOB_KIND_UNSPECIFIED),
                start_step=a.get("start_step", -2), planned_seconds=a.get("planned_seconds", 0),
                nodes=a.get("nodes", []),
            )
            for job_id, a in sorted(row.assignments.items()) if job_id in visible
        ],
        utilization=figures.get("utilization", 0.0), value=figures.get("value", 0.0),
        realtime_unmet=figures.get("realtime_unmet", 0), completed=figures.get("completed", 0),
        objective=figures.get("objective", 0.0), runtime_ms=figures.get("runtime_ms", 0.0),
        gap=figures.get("gap", 0.0),
    )


def _what_if_spec(request: allocator_pb2.WhatIfRequest) -> JobSpecData:
    if not request.HasField("spec"):
        raise InvalidArgument("spec", "required")
    return convert.spec_from_proto(request.spec)
