"""GPU-time weighted by GPU type, on a real PostgreSQL and over real gRPC: an H100 node and a
V100 node run the same leases; raw GPU-hours agree, weighted ones follow the rates, fairness
(standings, job F, the allocator's inputs) counts the weighted ones, and every write stays
idempotent, whatever rates the ledger runs with later.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from ledger_fixtures import ADMIN, LedgerServer, add_job, add_node, add_placement, add_tenant, exact_seconds
from sqlalchemy import delete, insert, select

from rota.allocator.ledger_link import LedgerStandings
from rota.cli.main import main as rota_main
from rota.client import Client
from rota.common.db import Database
from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.rates import rates_from_text
from rota.core.fairness.twostage import fair_tenant_key
from rota.ledger import repository
from rota.ledger.collector import collect_all
from rota.ledger.models import CollectedRow, UsageRow
from rota.v1 import ledger_pb2

H = timedelta(hours=1)
HOURS = 3600.0
H100 = Decimal("3.1699")  # the defaults: 989 / 312 and 125 / 312 TFLOPS
V100 = Decimal("0.4006")


@pytest.fixture
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as private:
        yield private


@pytest.fixture
def server(db: Database) -> Iterator[LedgerServer]:
    s = LedgerServer(db)
    yield s
    s.stop()


def totals(db: Database, by: str) -> dict[str, tuple[Decimal, Decimal]]:
    rows = db.run(lambda s: repository.usage_totals(s, by))
    return {t.key: (t.gpu_seconds, t.weighted_gpu_seconds) for t in rows}


def two_nodes(db: Database) -> tuple[datetime, Decimal]:
    """hopper runs 2 GPUs on an H100 node, volta 2 GPUs on a V100 node, over the same 2 h
    (from 40 minutes past an hour, so each lease is three rows). Equal shares on 8 live GPUs:
    quotas 4 and 4. Returns the start and one lease's seconds."""
    now = db.run(repository.db_now)
    start = now.replace(minute=40, second=0, microsecond=0) - 4 * H
    end = start + 2 * H
    for tenant in ("hopper", "volta"):
        add_tenant(db, tenant, created=now - 48 * H)
    add_node(db, "h1", 4, at=now, gpu_type="h100")
    add_node(db, "v1", 4, at=now, gpu_type="v100")
    add_job(db, "hj", "hopper", 2, start, finished=end)
    add_placement(db, "hj", "h1", [0, 1], start, end)
    add_job(db, "vj", "volta", 2, start, finished=end)
    add_placement(db, "vj", "v1", [2, 3], start, end)
    collect_all(db)
    return start, exact_seconds(start, end)


def test_raw_gpu_time_agrees_and_weighted_follows_the_rates_exactly_by_every_grouping(db: Database) -> None:
    _, seconds = two_nodes(db)
    raw = 2 * seconds
    assert totals(db, "tenant") == {"hopper": (raw, raw * H100), "volta": (raw, raw * V100)}
    assert totals(db, "job") == {"hj": (raw, raw * H100), "vj": (raw, raw * V100)}
    gpus = totals(db, "gpu")
    assert gpus == {"h1/0": (seconds, seconds * H100), "h1/1": (seconds, seconds * H100),
                    "v1/2": (seconds, seconds * V100), "v1/3": (seconds, seconds * V100)}
    # Exact numerics: the four groupings' sums agree to the last digit, raw and weighted.
    sums = {by: tuple(sum(col, Decimal(0)) for col in zip(*totals(db, by).values(), strict=True))
            for by in ("tenant", "job", "gpu", "day")}
    assert set(sums.values()) == {(2 * raw, raw * (H100 + V100))}
    rows = db.run(lambda s: [(r.node, r.gpu_types, r.gpu_rates, r.weighted_gpus) for r in s.scalars(select(UsageRow))])
    assert len(rows) == 6
    assert {(n, tuple(t), tuple(r), w) for n, t, r, w in rows} == {
        ("h1", ("h100", "h100"), (H100, H100), 2 * H100), ("v1", ("v100", "v100"), (V100, V100), 2 * V100),
    }


def test_rows_keep_the_rates_they_were_first_written_with(db: Database) -> None:
    _, seconds = two_nodes(db)
    before = totals(db, "tenant")
    # Every bookmark lost and the ledger restarted with other rates: the rows written again
    # are the same rows, charged as they were, and nothing is counted twice.
    db.run(lambda s: s.execute(delete(CollectedRow)))
    report = collect_all(db, rates=rates_from_text("h100=10,v100=10"))
    assert report.leases == 2
    assert totals(db, "tenant") == before
    # A new lease is charged at the rates the ledger runs with now.
    now = db.run(repository.db_now)
    start = now.replace(minute=0, second=0, microsecond=0) - 2 * H
    add_job(db, "hj2", "hopper", 1, start, finished=start + H)
    add_placement(db, "hj2", "h1", [3], start, start + H)
    collect_all(db, rates=rates_from_text("h100=10"))
    assert totals(db, "job")["hj2"] == (Decimal(3600), Decimal(36000))


def test_a_row_from_before_rates_and_a_gpu_of_unknown_type_count_one_per_gpu(db: Database) -> None:
    now = db.run(repository.db_now)
    add_tenant(db, "nlp")
    add_node(db, "plain", 2, at=now)  # registered without a type
    start = now.replace(minute=0, second=0, microsecond=0) - 3 * H
    add_job(db, "u1", "nlp", 2, start, finished=start + H)
    add_placement(db, "u1", "plain", [0, 1], start, start + H)
    collect_all(db)
    # As a row written before migration 0012 looks: no types, no rates, NULL weighted GPUs.
    db.run(lambda s: s.execute(insert(UsageRow).values(
        lease_id="old-1", sequence=0, job_id="o1", tenant="nlp", node="gone", gpu_indices=[0, 1, 2],
        hour=int((start + H).timestamp() // 3600), start_at=start + H, end_at=start + 2 * H,
    )))
    assert totals(db, "job") == {"u1": (Decimal(7200), Decimal(7200)), "o1": (Decimal(10800), Decimal(10800))}
    assert {k: v for k, v in totals(db, "gpu").items() if k.startswith("gone/")} == {
        f"gone/{i}": (Decimal(3600), Decimal(3600)) for i in range(3)
    }


def test_standings_and_job_fairness_count_weighted_gpu_time(db: Database, server: LedgerServer) -> None:
    two_nodes(db)
    raw_h = 2 * 2.0  # 2 GPUs for 2 h
    with Client.connect(server.target, token=ADMIN) as client:
        st = {t.tenant: t for t in client.standings().tenants}
        jobs = {j.job_id: j for j in client.job_fairness()}
        usage = {r.key: r for r in client.usage(by="tenant")}
    hopper, volta = st["hopper"], st["volta"]
    assert (hopper.quota, volta.quota) == (4, 4)
    assert hopper.deserved == pytest.approx(raw_h) and volta.deserved == pytest.approx(raw_h)
    assert hopper.raw_used == pytest.approx(raw_h) and volta.raw_used == pytest.approx(raw_h)
    assert hopper.used == pytest.approx(raw_h * float(H100)) and volta.used == pytest.approx(raw_h * float(V100))
    assert hopper.fairness == pytest.approx(float(H100)) and volta.fairness == pytest.approx(float(V100))
    assert jobs["hj"].used == pytest.approx(raw_h * float(H100)) and jobs["hj"].raw_used == pytest.approx(raw_h)
    assert jobs["vj"].fairness == pytest.approx(float(V100))
    assert usage["hopper"].gpu_hours == pytest.approx(raw_h) == usage["volta"].gpu_hours
    assert usage["hopper"].weighted_gpu_hours == pytest.approx(raw_h * float(H100))
    assert usage["volta"].weighted_gpu_hours == pytest.approx(raw_h * float(V100))

    # The allocator's `fair` policy reads the weighted use: with equal GPUs held, the tenant
    # that ran on V100s has had less service and is served first.
    cfg = FairnessConfig()

    async def read() -> Any:
        return await LedgerStandings(server.target, ADMIN).fair_inputs(cfg, {"hopper": 2, "volta": 2})

    fair = asyncio.run(read())
    assert fair is not None
    assert fair.tenants["hopper"].used == pytest.approx(raw_h * float(H100) * HOURS)
    assert fair_tenant_key(fair.tenants["volta"], cfg) < fair_tenant_key(fair.tenants["hopper"], cfg)


def test_record_usage_is_rated_by_its_nodes_types_and_a_retry_counts_nothing_twice(
    db: Database, server: LedgerServer
) -> None:
    two_nodes(db)
    start = int((db.run(repository.db_now) - 30 * H).timestamp()) // 3600 * 3600 * 1000
    on_h100 = ledger_pb2.RecordUsageRequest(
        lease_id="ext-1", sequence=0, job_id="ext", tenant="volta", node="h1", gpus=[2],
        start_unix_ms=start, end_unix_ms=start + 1_800_000,
    )
    elsewhere = ledger_pb2.RecordUsageRequest(
        lease_id="ext-2", sequence=0, job_id="ext2", tenant="volta", node="n9", gpus=[0, 1],
        start_unix_ms=start, end_unix_ms=start + 1_800_000,
    )
    with Client.connect(server.target, token=ADMIN) as client:
        for request in (on_h100, elsewhere):
            assert client._call(client._ledger.RecordUsage, request).recorded
            assert not client._call(client._ledger.RecordUsage, request).recorded
        jobs = {r.key: r for r in client.usage(by="job")}
    assert (jobs["ext"].gpu_hours, jobs["ext"].weighted_gpu_hours) == pytest.approx((0.5, 0.5 * float(H100)))
    assert (jobs["ext2"].gpu_hours, jobs["ext2"].weighted_gpu_hours) == pytest.approx((1.0, 1.0))  # unknown node


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        rota_main(list(argv))
    out, _ = capsys.readouterr()
    return int(exit_.value.code or 0), out


def test_rota_usage_shows_raw_and_weighted_gpu_hours_and_short_jobs_are_not_zero(
    db: Database, server: LedgerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nodes(db)
    now = db.run(repository.db_now)
    start = now.replace(minute=0, second=0, microsecond=0) - 2 * H
    add_job(db, "tiny", "volta", 1, start, finished=start + timedelta(minutes=1))
    add_placement(db, "tiny", "v1", [0], start, start + timedelta(minutes=1))
    collect_all(db)
    conn = ["--endpoint", server.target, "--token", ADMIN]
    code, out = run_cli(capsys, "usage", "--by", "job", "--json", *conn)
    data = json.loads(out)
    assert code == 0
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["hj"]["gpu_hours"] == pytest.approx(4.0)
    assert rows["hj"]["weighted_gpu_hours"] == pytest.approx(4.0 * float(H100))
    assert rows["tiny"]["gpu_hours"] == pytest.approx(1 / 60)
    assert data["total_gpu_hours"] == pytest.approx(8.0 + 1 / 60)
    assert data["total_weighted_gpu_hours"] == pytest.approx(4.0 * float(H100 + V100) + float(V100) / 60)
    code, out = run_cli(capsys, "usage", "--by", "job", *conn)
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert code == 0 and out.splitlines()[0].split() == ["JOB", "TENANT", "GPU-H", "WEIGHTED", "GPU-H"]
    assert lines["hj"][2:] == ["4.000", "12.68"]
    assert lines["tiny"][2:] == ["0.01667", f"{V100 / 60:.6f}"]  # four significant digits, not 0.00
    code, out = run_cli(capsys, "fairness", *conn)
    assert code == 0 and "RAW USED" in out and "weighted" in out

