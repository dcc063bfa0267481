"""A plan's trigger as each caller reads it: its own jobs by id, every other tenant's hidden."""

from __future__ import annotations

from datetime import UTC, datetime

from rota.allocator.models import PlanStepRow
from rota.allocator.service import HIDDEN_JOB, plan_step_to_proto, trigger_job_ids, visible_trigger
from rota.common.auth import ADMIN, TENANT, Identity

OWNERS = {"j-aaaaaaaaaa_0": "alpha", "j-aaaaaaaaaa_1": "alpha", "j-bbbbbbbbbb": "beta"}
ALPHA, BETA, ADMIN_ID = Identity(TENANT, "alpha"), Identity(TENANT, "beta"), Identity(ADMIN)


def step(trigger: str, assignments: dict[str, dict[str, str]] | None = None) -> PlanStepRow:
    return PlanStepRow(epoch=9, created_at=datetime(2026, 1, 1, tzinfo=UTC), policy="fast", trigger=trigger,
                       step_seconds=30.0, horizon=4, step_index=1, figures={}, assignments=assignments or {},
                       grid={"labels": ["n:0"], "rows": [[["", 4]]]})


def test_array_task_ids_are_found_whole() -> None:
    assert trigger_job_ids("arrival of j-aaaaaaaaaa_0, j-aaaaaaaaaa_1, j-bbbbbbbbbb") == set(OWNERS)


def test_a_tenant_sees_its_own_jobs_and_not_another_tenants() -> None:
    text = "arrival of j-aaaaaaaaaa_0, j-aaaaaaaaaa_1, j-bbbbbbbbbb"
    assert visible_trigger(text, ALPHA, OWNERS) == f"arrival of j-aaaaaaaaaa_0, j-aaaaaaaaaa_1, {HIDDEN_JOB}"
    assert visible_trigger(text, BETA, OWNERS) == f"arrival of {HIDDEN_JOB}, {HIDDEN_JOB}, j-bbbbbbbbbb"
    assert visible_trigger(text, ADMIN_ID, {}) == text


def test_the_owner_of_a_completed_job_sees_its_id_though_the_plan_no_longer_holds_it() -> None:
    # The job left the plan (no assignment): its owner still reads its id, not "*".
    reply = plan_step_to_proto(step("completion of j-bbbbbbbbbb"), BETA, OWNERS)
    assert reply.trigger == "completion of j-bbbbbbbbbb"
    assert plan_step_to_proto(step("completion of j-bbbbbbbbbb"), ALPHA, OWNERS).trigger == f"completion of {HIDDEN_JOB}"


def test_an_id_cut_by_the_column_width_or_gone_is_hidden_from_a_tenant() -> None:
    assert visible_trigger("arrival of j-aaaaa", ALPHA, OWNERS) == f"arrival of {HIDDEN_JOB}"
    assert visible_trigger("arrival of j-cccccccccc", ALPHA, OWNERS) == f"arrival of {HIDDEN_JOB}"
    assert visible_trigger("step 12 began", ALPHA, {}) == "step 12 began"
