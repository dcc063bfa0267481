"""The forecaster's Postgres operations: idempotent observations and what the models read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.common.read_models import cluster_jobs as jobs
from rota.core.forecasting.own_runs import run_key
from rota.core.forecasting.predict import Completion
from rota.forecaster.models import CompletionRow, TrafficRow


def record_completion(
    session: Session, *, key: str, job_id: str | None, kind: str, features: dict[str, Any], gpus: int,
    declared_seconds: float | None, duration_seconds: float,
) -> bool:
    """Stores a completion; False when `key` was already recorded (nothing changes)."""
    stmt = insert(CompletionRow).values(
        key=key, job_id=job_id, kind=kind, features=features, gpus=gpus,
        declared_seconds=declared_seconds, duration_seconds=duration_seconds,
    ).on_conflict_do_nothing(index_elements=["key"]).returning(CompletionRow.id)
    return session.execute(stmt).scalar() is not None


def record_traffic(session: Session, *, key: str, app: str, at_unix: int, requests: float) -> bool:
    stmt = insert(TrafficRow).values(
        key=key, app=app, hour=at_unix // 3600, at_unix=at_unix, requests=requests,
    ).on_conflict_do_nothing(index_elements=["key"]).returning(TrafficRow.id)
    return session.execute(stmt).scalar() is not None


def last_completion_id(session: Session) -> int:
    return int(session.scalar(select(func.coalesce(func.max(CompletionRow.id), 0))) or 0)


def completions_after(session: Session, after_id: int) -> list[tuple[int, Completion]]:
    """Completions past `after_id`, each with its job's run key (tenant, name, spec) while the job
    is still in the cluster's read model; an imported completion has none."""
    rows = session.execute(
        select(CompletionRow, jobs.c.tenant, jobs.c.spec)
        .join(jobs, jobs.c.job_id == CompletionRow.job_id, isouter=True)
        .where(CompletionRow.id > after_id).order_by(CompletionRow.id)
    ).all()
    return [(r.id, Completion(r.kind, r.features, r.gpus, r.duration_seconds, r.declared_seconds,
                              run_key(tenant or "", dict(spec)) if spec is not None else None))
            for r, tenant, spec in rows]


def hourly_traffic(session: Session, app: str, since_hour: int, until_hour: int) -> dict[int, float]:
    """{unix hour: requests} of `app` in [since_hour, until_hour): samples of one hour add up."""
    stmt = (
        select(TrafficRow.hour, func.sum(TrafficRow.requests))
        .where(TrafficRow.app == app, TrafficRow.hour >= since_hour, TrafficRow.hour < until_hour)
        .group_by(TrafficRow.hour)
    )
    return {int(hour): float(total) for hour, total in session.execute(stmt).all()}


def job_spec(session: Session, job_id: str) -> dict[str, Any] | None:
    spec = session.scalar(select(jobs.c.spec).where(jobs.c.job_id == job_id))
    return dict(spec) if spec is not None else None


def realtime_app(session: Session, app: str) -> dict[str, Any] | None:
    """The spec of the latest realtime job named `app` (its features.capacity, max_swap)."""
    stmt = (
        select(jobs.c.spec).where(jobs.c.kind == "realtime", jobs.c.name == app)
        .order_by(jobs.c.created_at.desc()).limit(1)
    )
    spec: Sequence[Any] = session.scalars(stmt).all()
    return dict(spec[0]) if spec else None


def observe_finished_jobs(session: Session, limit: int = 500) -> int:
    """Records every succeeded batch-like job not yet observed; returns how many it recorded.

    Pulled from the `cluster_jobs` view (rota.cluster's read model) rather than pushed by whoever finishes a job, so a crash
    anywhere loses no observation; the key `completion:<job id>` makes a rerun a no-op.
    """
    seen = select(CompletionRow.job_id).where(CompletionRow.job_id.is_not(None))
    finished = session.execute(
        select(jobs.c.job_id, jobs.c.kind, jobs.c.gpus, jobs.c.spec, jobs.c.started_at, jobs.c.finished_at)
        .where(jobs.c.state == "SUCCEEDED", jobs.c.kind != "realtime", jobs.c.started_at.is_not(None),
               jobs.c.finished_at.is_not(None), jobs.c.job_id.not_in(seen))
        .order_by(jobs.c.finished_at).limit(limit)
    ).all()
    recorded = 0
    for job in finished:
        assert job.started_at is not None and job.finished_at is not None
        seconds = max(1e-3, (job.finished_at - job.started_at).total_seconds())
        spec = dict(job.spec)
        recorded += record_completion(
            session, key=f"completion:{job.job_id}", job_id=job.job_id, kind=job.kind, features=spec.get("features") or {},
            gpus=job.gpus, declared_seconds=spec.get("duration_seconds"), duration_seconds=seconds,
        )
    return recorded


def serving_counters(session: Session) -> list[tuple[str, str, float]]:
    """(job id, app name, requests served so far) of every running realtime app that reports
    a cumulative `served` counter through `rota.runtime.report`."""
    rows = session.execute(
        select(jobs.c.job_id, jobs.c.name, jobs.c.progress["served"].as_float())
        .where(jobs.c.kind == "realtime", jobs.c.state == "RUNNING", jobs.c.progress.has_key("served"))
    ).all()
    return [(job_id, name, float(served)) for job_id, name, served in rows if served is not None]
