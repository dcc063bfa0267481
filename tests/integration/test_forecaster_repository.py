"""The forecaster's observations on a real PostgreSQL: idempotent by key, read back in order."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from rota.common.db import Database, make_engine
from rota.forecaster import repository as repo


@pytest.fixture(scope="module")
def db(migrated_database_url: str) -> Iterator[Database]:
    engine = make_engine(migrated_database_url)
    yield Database(engine)
    engine.dispose()


def completion(db: Database, key: str, seconds: float = 60.0) -> bool:
    return db.run(lambda s: repo.record_completion(
        s, key=key, job_id=None, kind="training", features={"variant": "lora-sft", "params": 1e9, "tokens": 1e8},
        gpus=2, declared_seconds=30.0, duration_seconds=seconds))


def test_a_completion_is_recorded_once_per_key(db: Database) -> None:
    key = "completion:" + secrets.token_hex(4)
    before = db.run(repo.last_completion_id)
    assert completion(db, key) is True
    assert completion(db, key, seconds=999.0) is False  # a retry changes nothing
    rows = db.run(lambda s: repo.completions_after(s, before))
    mine = [c for _, c in rows if c.seconds in (60.0, 999.0)]
    assert len(mine) == 1 and mine[0].seconds == 60.0 and mine[0].declared_seconds == 30.0 and mine[0].gpus == 2


def test_completions_come_back_after_a_bookmark_in_order(db: Database) -> None:
    start = db.run(repo.last_completion_id)
    for i in range(3):
        completion(db, f"order:{secrets.token_hex(4)}", seconds=10.0 + i)
    rows = db.run(lambda s: repo.completions_after(s, start))
    assert [c.seconds for _, c in rows][-3:] == [10.0, 11.0, 12.0]
    assert [i for i, _ in rows] == sorted(i for i, _ in rows)
    assert db.run(repo.last_completion_id) == rows[-1][0]


def test_samples_of_one_hour_add_up_and_the_window_is_half_open(db: Database) -> None:
    app = "app-" + secrets.token_hex(4)
    hour = 500_000
    for key, at, n in (("a", hour * 3600, 10.0), ("b", hour * 3600 + 1800, 5.0), ("c", (hour + 1) * 3600, 7.0),
                       ("d", (hour + 2) * 3600, 1.0)):
        assert db.run(lambda s, k=key, t=at, v=n: repo.record_traffic(s, key=f"{app}:{k}", app=app, at_unix=t, requests=v))
    assert not db.run(lambda s: repo.record_traffic(s, key=f"{app}:a", app=app, at_unix=hour * 3600, requests=99.0))
    assert db.run(lambda s: repo.hourly_traffic(s, app, hour, hour + 2)) == {hour: 15.0, hour + 1: 7.0}
    assert db.run(lambda s: repo.hourly_traffic(s, "other-" + app, hour, hour + 2)) == {}


def test_every_succeeded_batch_job_is_observed_once_with_its_run_time(db: Database) -> None:
    from datetime import timedelta

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from rota.cluster.job_lifecycle import utcnow
    from rota.cluster.models import JobRow
    from rota.common.models import TenantRow
    from rota.forecaster.models import CompletionRow

    tenant, now = "t-" + secrets.token_hex(3), utcnow()

    def seed(session: Session) -> list[str]:
        session.add(TenantRow(name=tenant, share=1.0))
        session.flush()
        ids = []
        for kind, state, minutes in (("training", "SUCCEEDED", 7), ("realtime", "SUCCEEDED", 3), ("training", "FAILED", 2)):
            job_id = "j-" + secrets.token_hex(5)
            spec = {"kind": kind, "features": {"params": 1e9}, "duration_seconds": 300.0}
            session.add(JobRow(id=job_id, tenant=tenant, name="x", kind=kind, priority=5, gpus=2, spec=spec,
                               spec_hash="h", state=state, started_at=now - timedelta(minutes=minutes), finished_at=now))
            ids.append(job_id)
        return ids

    done, serving, failed = db.run(seed)
    assert db.run(repo.observe_finished_jobs) >= 1
    assert db.run(repo.observe_finished_jobs) == 0  # a rerun records nothing twice
    rows = db.run(lambda s: [(r.job_id, r.duration_seconds, r.declared_seconds, r.gpus)
                             for r in s.scalars(select(CompletionRow).where(CompletionRow.job_id.in_([done, serving, failed])))])
    assert rows == [(done, pytest.approx(420.0), 300.0, 2)]


def test_a_running_apps_served_counter_becomes_traffic_counted_once(db: Database) -> None:
    from sqlalchemy import select, update
    from sqlalchemy.orm import Session

    from rota.cluster.models import JobRow
    from rota.common.models import TenantRow
    from rota.forecaster.collector import CompletionCollector
    from rota.forecaster.models import TrafficRow

    tenant, job_id, app = "t-" + secrets.token_hex(3), "j-" + secrets.token_hex(5), "app-" + secrets.token_hex(3)

    def seed(session: Session) -> None:
        session.add(TenantRow(name=tenant, share=1.0))
        session.flush()
        session.add(JobRow(id=job_id, tenant=tenant, name=app, kind="realtime", priority=9, gpus=1,
                           spec={"kind": "realtime"}, spec_hash="h", state="RUNNING", progress={"served": 100}))

    def serve(total: int) -> None:
        db.run(lambda s: s.execute(update(JobRow).where(JobRow.id == job_id).values(progress={"served": total})))

    db.run(seed)
    now = [1_000_000.0]
    collector = CompletionCollector(db, 1.0, clock=lambda: now[0])
    assert db.run(collector.sample_traffic) == 0  # the first sample is the baseline
    serve(150)
    now[0] += 10
    assert db.run(collector.sample_traffic) == 1
    now[0] += 10
    assert db.run(collector.sample_traffic) == 0  # nothing served since
    rows = db.run(lambda s: [(r.app, r.requests, r.at_unix) for r in s.scalars(select(TrafficRow).where(TrafficRow.app == app))])
    assert rows == [(app, 50.0, 1_000_010)]
