"""The detector's own table: every verdict with its evidence (SPEC §7).

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
