"""How leases become usage rows, and what RecordUsage and `rota usage --since` accept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rota.cli.ledger_commands import parse_since
from rota.core.errors import InvalidArgument
from rota.ledger.collector import hour_index, lease_records, split_hours
from rota.ledger.repository import LeaseSource
from rota.ledger.service import record_from_proto
from rota.v1 import ledger_pb2

T0 = datetime(2026, 3, 1, 10, 40, tzinfo=UTC)


def test_a_lease_is_cut_at_every_hour_boundary_and_the_pieces_add_up() -> None:
    end = T0 + timedelta(hours=2, minutes=5)  # 10:40 -> 12:45
    pieces = split_hours(T0, end)
    assert [(a.hour, b.hour, b.minute) for _, a, b in pieces] == [(10, 11, 0), (11, 12, 0), (12, 12, 45)]
    assert [h for h, _, _ in pieces] == [hour_index(T0) + i for i in range(3)]
    assert sum((b - a for _, a, b in pieces), timedelta()) == end - T0


@pytest.mark.parametrize(
    ("start", "end", "count"),
    [
        pytest.param(T0, T0, 0, id="an empty lease has no rows"),
        pytest.param(T0, T0.replace(minute=59), 1, id="a lease inside one hour has one row"),
        pytest.param(T0, T0.replace(hour=11, minute=0), 1, id="a lease ending on a boundary has no row past it"),
    ],
)
def test_row_counts(start: datetime, end: datetime, count: int) -> None:
    assert len(split_hours(start, end)) == count


def test_lease_rows_are_keyed_by_placement_and_absolute_hour() -> None:
    p = LeaseSource(42, "j-1", "nlp", "n1", [0, 1], T0, None)
    rows = lease_records(p, T0 + timedelta(hours=1))
    assert [(r.lease_id, r.sequence) for r in rows] == [("p42", hour_index(T0)), ("p42", hour_index(T0) + 1)]
    # A release stamped before the start (clocks apart) is an empty lease, not a negative one.
    assert lease_records(p, T0 - timedelta(seconds=1)) == []


def _req(**kw: object) -> ledger_pb2.RecordUsageRequest:
    ms = int(T0.timestamp() * 1000)
    base: dict[str, object] = dict(lease_id="agent-7", sequence=3, job_id="j-1", tenant="nlp", node="n1",
                                   gpus=[0, 1], start_unix_ms=ms, end_unix_ms=ms + 60_000)
    base.update(kw)
    return ledger_pb2.RecordUsageRequest(**base)  # type: ignore[arg-type]


def test_a_valid_record_converts_to_utc_times() -> None:
    r = record_from_proto(_req())
    assert r.start == T0 and r.end == T0 + timedelta(minutes=1) and r.gpu_indices == [0, 1]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lease_id": ""}, "lease_id"),
        ({"job_id": "x" * 33}, "job_id"),
        ({"sequence": -1}, "sequence"),
        ({"gpus": []}, "gpus"),
        ({"gpus": [1, 1]}, "gpus"),
        ({"start_unix_ms": 0}, "start_unix_ms"),
        ({"end_unix_ms": int(T0.timestamp() * 1000) - 1}, "end_unix_ms"),
        ({"end_unix_ms": int(T0.timestamp() * 1000) + 3_600_000}, "end_unix_ms"),  # crosses 11:00
    ],
)
def test_a_bad_record_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        record_from_proto(_req(**change))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", T0 - timedelta(days=7)),
        ("24h", T0 - timedelta(hours=24)),
        ("1d12h", T0 - timedelta(days=1, hours=12)),
        ("90m", T0 - timedelta(minutes=90)),
        ("2026-02-01T00:00", datetime(2026, 2, 1, tzinfo=UTC)),
        ("2026-02-01T00:00+02:00", datetime(2026, 1, 31, 22, tzinfo=UTC)),
        ("", None),
    ],
)
def test_since_reads_a_span_back_from_now_or_an_iso_time(text: str, expected: datetime | None) -> None:
    assert parse_since(text, now=T0) == expected


def test_since_that_is_neither_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--since"):
        parse_since("yesterday", now=T0)
