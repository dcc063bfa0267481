"""rota_job_progress read from a real PostgreSQL: bounded key labels, keys per job and
series in all, the values left out counted, and a job's series gone once it ends."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from submission_builders import job_spec, new_tenant

from rota.api.metrics import MAX_PROGRESS_KEY_CHARS, MAX_PROGRESS_KEYS, cluster_families
from rota.cluster import submissions
from rota.cluster.job_lifecycle import Events
from rota.cluster.models import JobRow
from rota.common import metrics
from rota.common.db import Database


def running_job(db: Database, tenant: str, progress: dict[str, Any]) -> str:
    def store(session: Any) -> str:
        job, _ = submissions.submit_job(session, job_spec(tenant), "", Events())
        # The state a node's report gives a started job (this test reads the table, it plans nothing).
        session.execute(update(JobRow).where(JobRow.id == job.id).values(state="RUNNING", progress=progress))
        return job.id

    return db.run(store)


def progress_samples(db: Database) -> list[Any]:
    families = db.run(cluster_families)
    return next(f for f in families if f.name == "rota_job_progress").samples


def dropped(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("rota_job_progress_series_dropped_total", {"reason": reason}) or 0.0


def test_progress_series_are_bounded_counted_and_leave_with_their_job(private_db: Database) -> None:
    tenant = new_tenant(private_db)
    wide = running_job(private_db, tenant, {("k" * 300) + str(i): i for i in range(40)})
    small = running_job(private_db, tenant, {"loss": 0.25, "phase": "warmup"})
    keys_before = dropped("keys")

    samples = progress_samples(private_db)
    by_job: dict[str, list[str]] = {}
    for s in samples:
        by_job.setdefault(s.labels["job"], []).append(s.labels["key"])
    # 40 keys alike in their first 64 characters are one label; the loss is its job's only number.
    assert by_job == {wide: ["k" * MAX_PROGRESS_KEY_CHARS], small: ["loss"]}
    assert dropped("keys") == keys_before  # cut keys that collide are one value, not one dropped

    many = running_job(private_db, tenant, {f"k{i}": i for i in range(MAX_PROGRESS_KEYS + 5)})
    samples = progress_samples(private_db)
    assert sum(1 for s in samples if s.labels["job"] == many) == MAX_PROGRESS_KEYS
    assert dropped("keys") == keys_before + 5

    private_db.run(lambda s: s.execute(update(JobRow).where(JobRow.id == wide).values(state="SUCCEEDED")))
    assert wide not in {s.labels["job"] for s in progress_samples(private_db)}
