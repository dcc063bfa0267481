"""The allocator's own tables: every committed plan step (docs/design.md §3, the rolling horizon) and
what each job was last planned on (docs/design.md §5: forecasts beside the declared durations)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base


class PlanStepRow(Base):
    """One committed step: the grid it came from, what it started and resized, its figures.

    `epoch` comes from the same sequence as placement epochs, so plans and placements
    order together. `forecasts` holds the durations and demand curves the plan used.
    """

    __tablename__ = "plan_steps"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)
    policy: Mapped[str] = mapped_column(String(16), nullable=False)
    trigger: Mapped[str] = mapped_column(String(128), nullable=False)
    step_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    horizon: Mapped[int] = mapped_column(Integer, nullable=False)
    step_index: Mapped[int] = mapped_column(BigInteger, nullable=False)
    figures: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    assignments: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    grid: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    forecasts: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")


class JobForecastRow(Base):
    __tablename__ = "job_forecasts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    planned_seconds: Mapped[float | None] = mapped_column(Float)
    declared_seconds: Mapped[float | None] = mapped_column(Float)
    model: Mapped[str] = mapped_column(String(32), nullable=False)
    p50_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    p90_seconds: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
