"""The ledger on a real PostgreSQL: placements become hour-split usage rows, idempotently,
and GPU time is conserved: Σ per tenant = Σ per job = Σ per GPU = the placements' own
busy time, over any window, whatever crashes or repeats happen in between.

Each test has a database of its own, so totals over everything are its own rows.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from ledger_fixtures import add_job, add_node, add_placement, add_tenant, exact_seconds, release
from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import IntegrityError

from rota.cluster.models import PlacementRow
from rota.common.db import Database
from rota.core.errors import AlreadyExists, InvalidArgument
from rota.ledger import repository
from rota.ledger.collector import collect_all, hour_index
from rota.ledger.models import CollectedRow, UsageRow
from rota.ledger.repository import UsageRecord, usage_totals

H = timedelta(hours=1)


@pytest.fixture
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as private:
        yield private


def db_now(db: Database) -> datetime:
    return db.run(repository.db_now)


def totals(db: Database, by: str, since: datetime | None = None, until: datetime | None = None) -> dict[str, Decimal]:
    return {t.key: t.gpu_seconds for t in db.run(lambda s: usage_totals(s, by, since=since, until=until))}


def truth(db: Database, since: datetime | None, until: datetime | None) -> Decimal:
    """GPU-seconds straight from the placements (an open one counts up to where it was collected)."""
    def read(s: object) -> list[tuple[datetime, datetime | None, list[int], datetime | None]]:
        stmt = select(PlacementRow.created_at, PlacementRow.released_at, PlacementRow.gpu_indices,
                      CollectedRow.collected_until).outerjoin(CollectedRow, CollectedRow.placement_id == PlacementRow.id)
        return list(s.execute(stmt).all())  # type: ignore[attr-defined]

    total = Decimal(0)
    for start, released, gpus, collected in db.run(read):
        end = released or collected or start
        a, b = max(start, since or start), min(end, until or end)
        if b > a:
            total += exact_seconds(a, b) * len(gpus)
    return total


def assert_conserved(db: Database, since: datetime | None = None, until: datetime | None = None) -> Decimal:
    # Summed over rows: by user a key ("-", no user) repeats across tenants.
    by = {k: sum((t.gpu_seconds for t in db.run(lambda s, k=k: usage_totals(s, k, since=since, until=until))), Decimal(0))
          for k in ("tenant", "job", "user", "gpu", "day")}
    expected = truth(db, since, until)
    assert by == dict.fromkeys(by, expected), f"window {since} .. {until}"
    return expected


def workload(db: Database, now: datetime, seed: int = 7) -> list[int]:
    """Three tenants, two nodes, leases over the last 30 hours: many cross hour boundaries,
    a few still open. Returns the placement ids."""
    rng = random.Random(seed)
    for t in ("nlp", "vision", "rl"):
        add_tenant(db, t)
    nodes = {"n1": 4, "n2": 8}
    for n, g in nodes.items():
        add_node(db, n, g, at=now)
    ids = []
    for i in range(24):
        tenant = rng.choice(("nlp", "vision", "rl"))
        start = now - timedelta(seconds=rng.uniform(0.5, 30) * 3600)
        node = rng.choice(list(nodes))
        size = rng.choice([1, 2, 4])
        first = rng.randrange(0, nodes[node], size)
        job = add_job(db, f"j{i}", tenant, size, start - timedelta(minutes=rng.uniform(0, 90)))
        open_lease = i % 6 == 0
        end = None if open_lease else min(now, start + timedelta(seconds=rng.uniform(60, 5 * 3600)))
        ids.append(add_placement(db, job, node, list(range(first, first + size)), start, end))
    return ids


def test_gpu_time_is_conserved_over_any_window_and_a_second_run_changes_nothing(db: Database) -> None:
    now = db_now(db)
    workload(db, now)
    first = collect_all(db)
    assert first.leases == 24 and first.closed == 20
    rows = db.run(lambda s: s.scalar(select(func.count()).select_from(UsageRow)))
    whole = assert_conserved(db)
    assert whole > 0
    # Again: the closed leases are settled and skipped; the open ones only grow.
    again = collect_all(db)
    assert again.leases == 4 and again.closed == 0
    assert db.run(lambda s: s.scalar(select(func.count()).select_from(UsageRow))) >= rows
    rng = random.Random(3)
    windows = [(now - 31 * H, now), (now - 24 * H, None), (None, now - 5 * H)]
    windows += [(a, a + timedelta(seconds=rng.uniform(60, 10 * 3600)))
                for a in (now - timedelta(seconds=rng.uniform(0, 30 * 3600)) for _ in range(8))]
    hour = datetime.fromtimestamp(hour_index(now) * 3600, UTC)
    windows += [(hour - 5 * H, hour - 2 * H)]  # hour-aligned: whole buckets
    for since, until in windows:
        assert_conserved(db, since, until)


def test_every_row_lies_within_one_hour_keyed_by_its_absolute_hour(db: Database) -> None:
    now = db_now(db)
    add_tenant(db, "nlp")
    start = datetime.fromtimestamp(hour_index(now - 5 * H) * 3600, UTC) + timedelta(minutes=40)
    pid = add_placement(db, add_job(db, "j1", "nlp", 2, start), "n1", [0, 1], start, start + 2 * H + timedelta(minutes=5))
    collect_all(db)
    rows = db.run(lambda s: [(r.lease_id, r.sequence, r.start_at, r.end_at) for r in s.scalars(
        select(UsageRow).order_by(UsageRow.sequence))])
    h0 = hour_index(start)
    assert [(lid, seq) for lid, seq, _, _ in rows] == [(f"p{pid}", h0 + i) for i in range(3)]
    assert [(a.minute, (b - a).total_seconds() / 60) for _, _, a, b in rows] == [(40, 20), (0, 60), (0, 45)]


def test_a_lease_that_closes_later_settles_to_its_exact_end(db: Database) -> None:
    now = db_now(db)
    add_tenant(db, "nlp")
    start = now - 3 * H - timedelta(minutes=10)
    pid = add_placement(db, add_job(db, "j1", "nlp", 4, start), "n1", [0, 1, 2, 3], start, None)
    collect_all(db)
    open_total = assert_conserved(db)
    assert open_total >= exact_seconds(start, now) * 4
    # The release committed after the collector had already counted past it (its stamp is
    # earlier than what was collected): the rows shrink to the truth and later hours go.
    released = start + H + timedelta(minutes=5)
    release(db, pid, released)
    collect_all(db)
    assert totals(db, "job") == {"j1": exact_seconds(start, released) * 4}
    last_hour = db.run(lambda s: s.scalar(select(func.max(UsageRow.sequence))))
    assert last_hour == hour_index(released)
    assert assert_conserved(db) == exact_seconds(start, released) * 4


def test_an_open_lease_only_ever_grows(db: Database) -> None:
    now = db_now(db)
    add_tenant(db, "nlp")
    add_placement(db, add_job(db, "j1", "nlp", 1, now - H), "n1", [0], now - H, None)
    collect_all(db)
    before = totals(db, "job")["j1"]
    collect_all(db)
    after = totals(db, "job")["j1"]
    assert after > before
    # A stale report of the same row with an earlier end changes nothing.
    row = db.run(lambda s: s.scalars(select(UsageRow).order_by(UsageRow.sequence.desc())).first())
    stale = UsageRecord(row.lease_id, row.sequence, row.job_id, row.tenant, row.node, list(row.gpu_indices),
                        row.start_at, row.start_at)
    assert db.run(lambda s: repository.extend_usage(s, [stale])) == 0
    assert totals(db, "job")["j1"] == after


def test_a_crash_mid_run_loses_nothing_and_a_lost_bookmark_counts_nothing_twice(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = db_now(db)
    workload(db, now, seed=11)
    calls = 0
    real = repository.mark_collected

    def crash_on_fifth(*args: object, **kw: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("ledger killed")
        real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "mark_collected", crash_on_fifth)
    with pytest.raises(RuntimeError):
        collect_all(db)
    # The transaction died with it: nothing half-written.
    assert db.run(lambda s: s.scalar(select(func.count()).select_from(UsageRow))) == 0
    monkeypatch.setattr(repository, "mark_collected", real)
    collect_all(db)
    whole = assert_conserved(db)
    first = totals(db, "job")
    # Every bookmark lost (as after a restore): the next run recomputes the same rows.
    db.run(lambda s: s.execute(delete(CollectedRow)))
    collect_all(db)
    assert assert_conserved(db) >= whole
    for job, seconds in totals(db, "job").items():
        assert seconds >= first[job]  # open leases may have grown, nothing doubled
    assert totals(db, "job").keys() == first.keys()


def test_two_collectors_at_once_write_the_same_ledger_as_one(db: Database) -> None:
    now = db_now(db)
    ids = workload(db, now, seed=5)
    # Only closed leases, so the totals do not move with the clock.
    for pid in ids:
        db.run(lambda s, p=pid: s.execute(
            PlacementRow.__table__.update().where(PlacementRow.id == p, PlacementRow.released_at.is_(None))
            .values(released_at=now)))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: collect_all(db, batch=5), range(4)))
    expected = assert_conserved(db)
    assert sum(totals(db, "tenant").values(), Decimal(0)) == expected


def _record(end_minute: int = 30, **kw: object) -> UsageRecord:
    start = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    base: dict[str, object] = dict(lease_id="agent-1", sequence=0, job_id="j1", tenant="nlp", node="n1",
                                   gpu_indices=[0, 1], start=start, end=start + timedelta(minutes=end_minute))
    base.update(kw)
    return UsageRecord(**base)  # type: ignore[arg-type]


def test_record_usage_is_idempotent_grows_forward_and_refuses_a_different_usage_under_the_same_key(
    db: Database,
) -> None:
    add_tenant(db, "nlp")
    assert db.run(lambda s: repository.record_usage(s, _record()))
    assert not db.run(lambda s: repository.record_usage(s, _record()))  # a repeat
    assert db.run(lambda s: repository.record_usage(s, _record(45)))  # the same row, later end
    assert not db.run(lambda s: repository.record_usage(s, _record(20)))  # stale: never shrinks
    assert totals(db, "job") == {"j1": Decimal(45 * 60 * 2)}
    with pytest.raises(AlreadyExists, match="already recorded for job j1"):
        db.run(lambda s: repository.record_usage(s, _record(job_id="j2")))
    with pytest.raises(InvalidArgument) as err:
        db.run(lambda s: repository.record_usage(s, _record(lease_id="p12")))
    assert err.value.field == "lease_id"
    with pytest.raises(InvalidArgument) as err:
        db.run(lambda s: repository.record_usage(s, _record(tenant="ghost")))
    assert err.value.field == "tenant"


def test_the_database_itself_refuses_a_row_across_an_hour_boundary(db: Database) -> None:
    add_tenant(db, "nlp")
    with pytest.raises(IntegrityError, match="ck_ledger_usage_within_hour"):
        db.run(lambda s: repository.extend_usage(s, [_record(90)]))


def test_concurrent_repeats_of_one_record_write_it_once_and_keep_the_latest_end(db: Database) -> None:
    add_tenant(db, "nlp")
    with ThreadPoolExecutor(16) as pool:
        flags = list(pool.map(lambda _: db.run(lambda s: repository.record_usage(s, _record())), range(32)))
    assert flags.count(True) == 1
    ends = list(range(1, 33))
    random.Random(1).shuffle(ends)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda m: db.run(lambda s: repository.record_usage(s, _record(m))), ends))
    assert totals(db, "job") == {"j1": Decimal(32 * 60 * 2)}
    assert db.run(lambda s: s.scalar(select(func.count()).select_from(UsageRow))) == 1



def test_usage_by_user_is_each_users_jobs_and_adds_up_to_its_tenants(db: Database) -> None:
    now = db_now(db)
    workload(db, now)
    # What the api's submission path records for a user's token (rota.cluster writes it there).
    db.run(lambda s: s.execute(text("UPDATE jobs SET submitted_by = CASE WHEN id IN ('j0', 'j1', 'j2', 'j3') "
                                    "THEN 'ada' ELSE 'bob' END WHERE tenant = 'nlp'")))
    collect_all(db)
    rows = db.run(lambda s: usage_totals(s, "user"))
    by_tenant = totals(db, "tenant")
    for tenant in by_tenant:
        assert sum((r.gpu_seconds for r in rows if r.tenant == tenant), Decimal(0)) == by_tenant[tenant]
    assert {r.key for r in rows if r.tenant != "nlp"} <= {"-"}
    assert {r.key for r in rows if r.tenant == "nlp"} <= {"ada", "bob"}
