"""The collector: turns placements (Postgres truth) into hour-split usage rows, on a loop.

Nothing is carried in memory between runs. Each run recomputes, from the placements
table, the rows of every lease not yet settled: a closed lease gets exactly the rows of
[created_at, released_at); an open one the rows of [created_at, now), which later runs
only ever extend. Rows are keyed (f"p{placement id}", absolute hour index), so a crash
of the ledger (or of whatever writes placements) at any point loses no GPU-second and
counts none twice: the next run writes the same keys again.

Each row is rated by the types its GPUs advertised when the row is first written (read
from the node lifecycle's `node_gpu_types`), at the rates the ledger runs with; a row
written again keeps the rates it was first written with.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from rota.common.db import Database
from rota.core.errors import Unavailable
from rota.core.fairness.rates import DEFAULT_RATES, GpuRates
from rota.ledger import repository
from rota.ledger.models import HOUR_S
from rota.ledger.repository import UsageRecord

log = logging.getLogger(__name__)
BATCH = 500


def lease_id(placement_id: int, node_rank: int = 0) -> str:
    """p<placement>; a gang's node rank r > 0 is p<placement>n<r> (rank 0 keeps p<placement>)."""
    return f"p{placement_id}" if node_rank == 0 else f"p{placement_id}n{node_rank}"


def hour_index(t: datetime) -> int:
    return int(t.timestamp() // HOUR_S)


def hour_start(index: int) -> datetime:
    return datetime.fromtimestamp(index * HOUR_S, UTC)


def split_hours(start: datetime, end: datetime) -> list[tuple[int, datetime, datetime]]:
    """[start, end) cut at hour boundaries: (hour index, piece start, piece end); empty
    pieces are left out, so a lease that ends on a boundary has no row for the next hour."""
    out: list[tuple[int, datetime, datetime]] = []
    t = start
    while t < end:
        h = hour_index(t)
        piece_end = min(end, hour_start(h) + timedelta(seconds=HOUR_S))
        out.append((h, t, piece_end))
        t = piece_end
    return out


def lease_records(p: repository.LeaseSource, end: datetime, rates: GpuRates = DEFAULT_RATES) -> list[UsageRecord]:
    end = max(end, p.start)  # a release stamped by a clock behind the database's
    types = p.gpu_types or ("",) * len(p.gpu_indices)
    return [
        UsageRecord(lease_id(p.placement_id, p.node_rank), h, p.job_id, p.tenant, p.node, p.gpu_indices, a, b).rated(types, rates)
        for h, a, b in split_hours(p.start, end)
    ]


@dataclass
class CollectReport:
    leases: int = 0
    closed: int = 0
    next_after: int | None = None  # the last placement id of a full batch: more may follow


def collect(session: Session, after: int = 0, batch: int = BATCH, rates: GpuRates = DEFAULT_RATES) -> CollectReport:
    """One transaction: the next `batch` unsettled placements with ids above `after`."""
    report = CollectReport()
    # Collectors take turns: one that read a lease open must not extend it after another
    # settled it closed. (The transaction is SERIALIZABLE, whose snapshot predates the lock
    # wait: a collector that waited on another then fails to serialize and runs again,
    # from a snapshot that includes the other's work; the lock keeps that to one retry.)
    repository.lock_collector(session)
    now = repository.db_now(session)
    sources = repository.unsettled_placements(session, after, batch)
    for p in sources:
        closed = p.released_at is not None
        end = p.released_at if p.released_at is not None else now
        records = lease_records(p, end, rates)
        if closed:
            repository.settle_lease(session, lease_id(p.placement_id, p.node_rank), records)
        else:
            repository.extend_usage(session, records)
        repository.mark_collected(session, p.placement_id, max(end, p.start), closed)
        report.leases += 1
        report.closed += closed
    if len({p.placement_id for p in sources}) == batch:
        report.next_after = sources[-1].placement_id
    return report


def collect_all(db: Database, batch: int = BATCH, rates: GpuRates = DEFAULT_RATES) -> CollectReport:
    """Every unsettled placement, a batch per transaction, so a long backlog (after an
    outage) never becomes one huge transaction."""
    total = CollectReport()
    after: int | None = 0
    while after is not None:
        # SERIALIZABLE, run again on a serialization failure: usage written from a
        # snapshot another writer has since changed would count GPU time twice or not at all.
        report = db.run_serializable(functools.partial(collect, after=after, batch=batch, rates=rates))
        total.leases += report.leases
        total.closed += report.closed
        after = report.next_after
    return total


class Collector:
    """The ledger's background task: `collect` every `interval_s`, forever."""

    def __init__(self, db: Database, interval_s: float = 5.0, rates: GpuRates = DEFAULT_RATES) -> None:
        self.db = db
        self.interval_s = interval_s
        self.rates = rates

    async def run_forever(self) -> None:
        while True:
            try:
                report = await asyncio.to_thread(collect_all, self.db, BATCH, self.rates)
                if report.closed:
                    log.info("ledger collected %d leases (%d settled)", report.leases, report.closed)
            except Unavailable as exc:
                log.warning("ledger collection skipped: %s", exc)
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad run
                log.exception("ledger collection failed")
            await asyncio.sleep(self.interval_s)
