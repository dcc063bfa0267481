"""AllocatorService adapter: Plan (a scenario, pure), CurrentPlan (the live plan), Explain,
and WhatIf (when a job would start if submitted now)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import grpc

from rota.allocator import repository
from rota.allocator.models import PlanStepRow
from rota.cluster import planner_view
from rota.cluster.job_lifecycle import get_job, utcnow
from rota.common import convert
from rota.common.auth import Identity, current_identity
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.models import TenantRow
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
JOB_ID_IN_TEXT = re.compile(r"\bj-[0-9a-z]+\b")  # rota.cluster.job_lifecycle.new_job_id's shape


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
        row = await asyncio.to_thread(self.db.run, repository.latest_plan_step)
        if row is None:
            raise NotFound("no plan yet: the allocator plans once a node has registered")
        return plan_step_to_proto(row, identity)

    async def WhatIf(self, request: allocator_pb2.WhatIfRequest, context: grpc.aio.ServicerContext) -> allocator_pb2.WhatIfResponse:
        identity = current_identity()
        spec = _what_if_spec(request)
        if not identity.is_admin:
            if spec.tenant and spec.tenant != identity.tenant:
                raise InvalidArgument("tenant", f"a token of tenant {identity.tenant!r} cannot ask for {spec.tenant!r}")
            spec.tenant = identity.tenant
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


def plan_step_to_proto(row: PlanStepRow, identity: Identity) -> allocator_pb2.CurrentPlanResponse:
    """The stored step as the caller may see it: other tenants' job ids are masked."""
    visible = {job_id for job_id, a in row.assignments.items() if identity.may_access(a.get("tenant", ""))}

    def cell(value: str) -> str:
        return value if not value or value in visible else OTHER_TENANT

    grid = [allocator_pb2.GridRow(cells=[cell(c) for c, n in runs for _ in range(n)]) for runs in row.grid["rows"]]
    figures: dict[str, Any] = row.figures
    # The trigger's words name the jobs that changed ("arrival of j-..."): others' masked too.
    trigger = JOB_ID_IN_TEXT.sub(lambda m: cell(m.group(0)), row.trigger or "")
    return allocator_pb2.CurrentPlanResponse(
        epoch=row.epoch, created_at=convert.timestamp(row.created_at), policy=row.policy, trigger=trigger,
        step_seconds=row.step_seconds, horizon=row.horizon, gpu_labels=list(row.grid["labels"]), grid=grid,
        jobs=[
            allocator_pb2.PlannedJob(
                job_id=job_id, tenant=a["tenant"], kind=a["kind"], node=a.get("node", ""), gpus=a.get("gpus", []),
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
    if request.HasField("spec"):
        return convert.spec_from_proto(request.spec)
    if not request.job_spec_json:
        raise InvalidArgument("spec", "required")
    try:
        data = json.loads(request.job_spec_json)
        return JobSpecData.from_dict(data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidArgument("job_spec_json", f"not a job spec ({exc})") from None
