"""The ledger's own tables: GPU-time usage rows and the collector's progress per placement.

A usage row is one lease's GPU time inside one hour: rows are split at hour boundaries
(the database refuses one that straddles an hour), so an hourly bucket is an exact
GROUP BY and any window is an exact clip. The key (lease_id, sequence) makes every
write idempotent; leases collected from placements use lease_id "p<placement id>" and
the absolute hour index as the sequence.

A row also says what its GPUs were and what each counted for: `gpu_types` and
`gpu_rates` (aligned with `gpu_indices`) and their sum `weighted_gpus`, fixed when the row
is first written (an extension or a retry leaves them as they are, so a rate changed later
re-rates no GPU-second already charged). Rows written before GPU types were rated (0012)
have them empty and NULL: one per GPU, as they were charged then.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base

HOUR_S = 3600


class UsageRow(Base):
    __tablename__ = "ledger_usage"
    __table_args__ = (
        CheckConstraint("end_at >= start_at", name="ck_ledger_usage_span"),
        CheckConstraint(
            "start_at >= to_timestamp(hour * 3600) AND end_at <= to_timestamp((hour + 1) * 3600)",
            name="ck_ledger_usage_within_hour",
        ),
        CheckConstraint("cardinality(gpu_indices) > 0", name="ck_ledger_usage_gpus"),
        CheckConstraint(
            "cardinality(gpu_types) IN (0, cardinality(gpu_indices))"
            " AND cardinality(gpu_rates) IN (0, cardinality(gpu_indices))"
            " AND (weighted_gpus IS NULL OR weighted_gpus > 0)",
            name="ck_ledger_usage_rates",
        ),
        Index("ix_ledger_usage_tenant_hour", "tenant", "hour"),
        Index("ix_ledger_usage_hour", "hour"),
        Index("ix_ledger_usage_job_id", "job_id"),
    )

    lease_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(32), nullable=False)
    tenant: Mapped[str] = mapped_column(String(64), nullable=False)
    node: Mapped[str] = mapped_column(String(64), nullable=False)
    gpu_indices: Mapped[list[int]] = mapped_column(ARRAY(Integer), nullable=False)
    hour: Mapped[int] = mapped_column(BigInteger, nullable=False)  # floor(start / 3600 s): the bucket
    start_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    end_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    gpu_types: Mapped[list[str]] = mapped_column(ARRAY(String(32)), nullable=False, server_default="{}")
    gpu_rates: Mapped[list[Decimal]] = mapped_column(ARRAY(Numeric), nullable=False, server_default="{}")
    weighted_gpus: Mapped[Decimal | None] = mapped_column(Numeric)  # Σ gpu_rates; NULL: before 0012


class CollectedRow(Base):
    """How far the collector has turned one placement into usage; `closed` once it is final.

    Only a bookmark: deleting every row here makes the next run recompute the same usage.
    """

    __tablename__ = "ledger_collected"

    placement_id: Mapped[int] = mapped_column(
        ForeignKey("placements.id", ondelete="CASCADE"), primary_key=True
    )
    collected_until: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    closed: Mapped[bool] = mapped_column(Boolean, nullable=False)
