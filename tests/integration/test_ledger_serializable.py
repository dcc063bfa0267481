"""Ledger writes are SERIALIZABLE and run again on a serialization failure (SQLSTATE 40001),
on a real PostgreSQL: concurrent writers really conflict, and GPU-seconds are still
conserved (none lost, none counted twice).

Each test has a database of its own, so totals over everything are its own rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from ledger_fixtures import add_job, add_node, add_placement, add_tenant, exact_seconds
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from rota.common.db import Database, TransactionConflict, make_engine, sqlstate
from rota.ledger import repository
from rota.ledger.collector import collect, collect_all
from rota.ledger.models import UsageRow
from rota.ledger.repository import UsageRecord, usage_totals


@pytest.fixture
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated(pool_size=8) as private:
        yield private


def totals(db: Database) -> dict[str, Decimal]:
    """The whole ledger's GPU-seconds, summed by tenant, by job and by GPU."""
    return {by: sum((t.gpu_seconds for t in db.run(lambda s, b=by: usage_totals(s, b))), Decimal(0))
            for by in ("tenant", "job", "gpu")}


def wait_until_blocked(db: Database, application: str, writer: Future[Any]) -> None:
    """Returns once a backend of `application` waits on a lock (a condition, no timing);
    fails if `writer` finishes first, i.e. never waited."""
    query = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name LIKE :app")
    while not db.run(lambda s: s.scalar(query, {"app": application + "%"})):
        if writer.done():
            writer.result()  # its error, if it failed
            raise AssertionError(f"{application} finished without waiting for the other writer")
        threading.Event().wait(0.01)


def wait_set(event: threading.Event, writer: Future[Any]) -> None:
    """Waits for `event`, or fails with `writer`'s error if it stopped before setting it."""
    while not event.wait(0.05):
        if writer.done():
            writer.result()
            raise AssertionError("the writer returned before signalling")


def test_two_writers_of_one_lease_conflict_and_the_later_report_wins_once(databases: Any) -> None:
    """Writer A has written a lease's row but not committed; writer B reports the same
    lease, later. B's write waits for A, then fails to serialize (40001) and runs again,
    seeing A's row: the lease counts B's longer span once, not A's plus B's."""
    url = databases.create_migrated()
    engines = [make_engine(url, name=name) for name in ("ledger-a", "ledger-b")]
    a, b = (Database(e) for e in engines)
    try:
        add_tenant(a, "nlp")
        start = top_of_hour(a.run(repository.db_now) - timedelta(hours=3))  # a record stays in its hour
        short = UsageRecord("r-1", 0, "j1", "nlp", "n1", [0, 1], start, start + timedelta(minutes=10))
        longer = UsageRecord("r-1", 0, "j1", "nlp", "n1", [0, 1], start, start + timedelta(minutes=25))
        a_wrote, a_may_commit = threading.Event(), threading.Event()
        retries: list[TransactionConflict] = []

        def writer_a(s: Session) -> bool:
            recorded = repository.record_usage(s, short)
            a_wrote.set()
            a_may_commit.wait()
            return recorded

        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(a.run_serializable, writer_a)
            try:
                wait_set(a_wrote, first)
                second = pool.submit(b.run_serializable, lambda s: repository.record_usage(s, longer),
                                     on_retry=retries.append)
                wait_until_blocked(a, "ledger-b", second)  # B waits on A's uncommitted row
            finally:
                a_may_commit.set()  # whatever failed above, A must not wait forever
            assert first.result() is True
            assert second.result() is True  # on its second attempt: the row grew

        assert retries and {sqlstate(r.__cause__) for r in retries} == {"40001"}  # type: ignore[arg-type]
        [row] = a.run(lambda s: list(s.scalars(select(UsageRow))))
        assert row.end_at == longer.end
        expected = exact_seconds(longer.start, longer.end) * 2
        assert totals(a) == dict.fromkeys(("tenant", "job", "gpu"), expected)
    finally:
        for engine in engines:
            engine.dispose()
        databases.drop(url)


def top_of_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def test_concurrent_collectors_and_reporters_conserve_gpu_seconds(db: Database) -> None:
    """Several collectors at once over the same placements, with reporters writing their
    own leases meanwhile: every writer commits, and the totals equal the truth exactly."""
    now = db.run(repository.db_now)
    for tenant in ("nlp", "vision"):
        add_tenant(db, tenant)
    add_node(db, "n1", 8, at=now)
    truth = Decimal(0)
    for i in range(40):
        start = now - timedelta(hours=6) + timedelta(minutes=7 * i)
        end = start + timedelta(minutes=50 + i)
        job = add_job(db, f"j{i}", ("nlp", "vision")[i % 2], 2, start)
        add_placement(db, job, "n1", [2 * (i % 4), 2 * (i % 4) + 1], start, end)
        truth += exact_seconds(start, end) * 2
    reported_from = top_of_hour(now - timedelta(hours=2))  # a record stays in its hour
    reports = [UsageRecord(f"r-{k}", 0, f"x{k}", "nlp", "n2", [0], reported_from,
                           reported_from + timedelta(minutes=m))
               for k in range(5) for m in (5, 15, 10)]  # each lease reported three times, out of order
    truth += sum((exact_seconds(reported_from, reported_from + timedelta(minutes=15)) for _ in range(5)), Decimal(0))

    def collector() -> None:
        collect_all(db, batch=7)  # small batches: many transactions, many chances to collide

    def reporter(r: UsageRecord) -> None:
        db.run_serializable(lambda s: repository.record_usage(s, r))

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(collector) for _ in range(4)] + [pool.submit(reporter, r) for r in reports]
        for f in futures:
            f.result()  # every writer committed (or this raises)

    assert totals(db) == dict.fromkeys(("tenant", "job", "gpu"), truth)
    # Nothing left to collect, and running again changes nothing.
    assert db.run_serializable(lambda s: collect(s)).leases == 0
    assert db.run(lambda s: s.scalar(select(func.count()).select_from(UsageRow))) > 40
    assert totals(db) == dict.fromkeys(("tenant", "job", "gpu"), truth)
