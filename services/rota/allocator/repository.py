"""The allocator's own tables: plan steps and forecasts (starts and the live view: rota.cluster)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from rota.allocator.models import JobForecastRow, PlanStepRow
from rota.cluster import job_starts
from rota.common import read_models
from rota.core.planning.moves import MoveCost, MoveInputs

PAUSE_EXIT_S = 1.0  # a paused job's process exit, after its state is copied out


def record_plan_step(session: Session, **values: Any) -> PlanStepRow:
    epoch = job_starts.next_epoch(session)
    row = PlanStepRow(epoch=epoch, **values)
    session.add(row)
    session.flush()
    return row


def prune_plan_steps(session: Session, older_than_s: float, batch: int) -> int:
    """Deletes up to `batch` plan steps created more than `older_than_s` ago, oldest first,
    never the newest (CurrentPlan shows it however old it is); returns how many went."""
    newest = select(func.max(PlanStepRow.id)).scalar_subquery()
    doomed = (
        select(PlanStepRow.id)
        .where(PlanStepRow.created_at < func.now() - timedelta(seconds=older_than_s), PlanStepRow.id < newest)
        .order_by(PlanStepRow.id)
        .limit(batch)
    )
    result = session.execute(delete(PlanStepRow).where(PlanStepRow.id.in_(doomed)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def latest_plan_step(session: Session) -> PlanStepRow | None:
    return session.scalars(select(PlanStepRow).order_by(PlanStepRow.id.desc()).limit(1)).first()


# One statement whatever the number of jobs (arrays, not a VALUES row per job): its text,
# and so its parsing and planning, is the same for 1 or 2,000 forecasts.
SAVE_FORECASTS_SQL = text("""
INSERT INTO job_forecasts (job_id, planned_seconds, declared_seconds, model, p50_seconds, p90_seconds)
SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:planned AS float8[]), CAST(:declared AS float8[]),
                     CAST(:models AS text[]), CAST(:p50 AS float8[]), CAST(:p90 AS float8[]))
ON CONFLICT (job_id) DO UPDATE SET planned_seconds = excluded.planned_seconds,
    declared_seconds = excluded.declared_seconds, model = excluded.model,
    p50_seconds = excluded.p50_seconds, p90_seconds = excluded.p90_seconds, updated_at = now()
""")


def save_forecasts(session: Session, forecasts: dict[str, dict[str, Any]]) -> None:
    """What each job was planned on, for `rota job` (predicted beside actual duration)."""
    if not forecasts:
        return
    values = list(forecasts.values())
    session.execute(SAVE_FORECASTS_SQL, {
        "job_ids": list(forecasts), "planned": [fc.get("planned_seconds") for fc in values],
        "declared": [fc.get("declared_seconds") for fc in values], "models": [fc["model"] for fc in values],
        "p50": [fc.get("p50_seconds", 0.0) for fc in values], "p90": [fc.get("p90_seconds", 0.0) for fc in values],
    })


def job_forecast(session: Session, job_id: str) -> JobForecastRow | None:
    return session.get(JobForecastRow, job_id)


def move_inputs(session: Session, movable: Sequence[str]) -> MoveInputs:
    """What the planner needs to move jobs: the measured costs of the `movable` jobs (those
    with a complete image; see rota.checkpoint) and the node each pending job asked for."""
    costs: dict[str, MoveCost] = {}
    for job_id, c in read_models.checkpoint_costs(session, movable).items():
        # Never paused yet: its last checkpoint's copy time plus an exit stands in for a pause.
        pause_s = c.pause_s if c.pauses else c.copy_s + PAUSE_EXIT_S
        # Restoring reads back what the write stored, through the same chunk store.
        costs[job_id] = MoveCost(pause_s=pause_s, restore_s=c.write_s)
    return MoveInputs(costs=costs, targets=read_models.pending_resume_targets(session))
