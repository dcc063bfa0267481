"""The detector's tables: every verdict with its evidence, applied layouts, bad devices (docs/design.md §7).

A verdict is a fact an operator acts on (drain a node, re-plan a job), so it is
committed to Postgres before it is answered; `key` makes a repeated report or a second
detector seeing the same silence record it once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base


class VerdictRow(Base):
    __tablename__ = "detector_verdicts"
    __table_args__ = (Index("ix_detector_verdicts_job_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200), nullable=False, unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    rank: Mapped[int] = mapped_column(Integer, nullable=False)  # -1: the job as a whole
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # slow | stop
    iteration: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ratio: Mapped[float] = mapped_column(Float, nullable=False)
    node: Mapped[str | None] = mapped_column(String(64))
    gpu: Mapped[int | None] = mapped_column(Integer)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class JobLayoutRow(Base):
    """The 3-D layout an applied re-plan gave a job: every later launch passes it on as
    ROTA_LAYOUT, so a restart for any reason (migration, failure, requeue) keeps it."""

    __tablename__ = "job_layouts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    layout: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    from_epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)  # the placement it was planned on
    # The Replan call that applied it: a retry with the same id finds it and migrates once.
    operation_id: Mapped[str] = mapped_column(String(128), nullable=False, server_default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class DeviceHealthRow(Base):
    """A GPU taken out of the plan (BAD) by a verdict, until an operator clears it (CLEARED).

    Keyed by (node, gpu index), not by the gpus row: an agent that re-registers rewrites
    its GPUs, and a device must stay out of the plan across that.
    """

    __tablename__ = "device_health"

    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False)  # BAD | CLEARED
    reason: Mapped[str] = mapped_column(String(512), nullable=False, server_default="")
    job_id: Mapped[str | None] = mapped_column(String(32))  # no foreign key: the mark outlives the job
    rank: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16), nullable=False, server_default="")  # stop | slow
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
