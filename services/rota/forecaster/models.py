"""The forecaster's own tables: what it learns from (docs/design.md §5).

Every completed job and every traffic sample is one row, idempotent by `key`: a retried
Observe finds the key taken and changes nothing. A completion keeps a snapshot of the
job's kind, features and declared duration, so the models can be refit from this table
alone even after the job rows are gone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base


class CompletionRow(Base):
    __tablename__ = "forecast_completions"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(160), nullable=False, unique=True)
    job_id: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    features: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    gpus: Mapped[int] = mapped_column(Integer, nullable=False)
    declared_seconds: Mapped[float | None] = mapped_column(Float)
    duration_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class TrafficRow(Base):
    """Requests an app served, attributed to the unix hour of `at_unix`."""

    __tablename__ = "forecast_traffic"
    __table_args__ = (Index("ix_forecast_traffic_app_hour", "app", "hour"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(160), nullable=False, unique=True)
    app: Mapped[str] = mapped_column(String(128), nullable=False)
    hour: Mapped[int] = mapped_column(BigInteger, nullable=False)
    at_unix: Mapped[int] = mapped_column(BigInteger, nullable=False)
    requests: Mapped[float] = mapped_column(Float, nullable=False)
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
