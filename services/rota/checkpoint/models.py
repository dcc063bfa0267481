"""The checkpoint coordinator's tables: images, their manifests, the chunks they use, operations.

An image is one checkpoint of one job (all its ranks). Each rank's manifest lists its
tensors and the content hashes of the fixed-size chunks that hold them; the chunk bytes
live in the chunk store, not here. `checkpoint_image_chunks` is the reference set the
garbage collector reads, and its foreign key to `checkpoint_chunks` is RESTRICT: the
database itself refuses to forget a chunk that any image still names, whatever a
collector racing a checkpoint believes.

An operation (checkpoint, pause, resume, migrate) is a durable record that moves through
states, so a coordinator restarted mid-operation finds it and finishes or rolls it back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from rota.common.models import Base


class ChunkRow(Base):
    """A chunk known to be in the store. `touched_at` is refreshed by every writer that
    reuses it, so the collector's grace period covers a checkpoint still in flight."""

    __tablename__ = "checkpoint_chunks"
    __table_args__ = (Index("ix_checkpoint_chunks_touched_at", "touched_at"),)

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    touched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ImageRow(Base):
    __tablename__ = "checkpoint_images"
    __table_args__ = (
        UniqueConstraint("job_id", "sequence", name="uq_checkpoint_images_job_sequence"),
        Index("ix_checkpoint_images_job_state", "job_id", "state"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    sequence: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # checkpoint | periodic | pause
    state: Mapped[str] = mapped_column(String(16), nullable=False)  # writing | complete | failed
    node: Mapped[str] = mapped_column(String(64), nullable=False, server_default="")
    ranks: Mapped[int] = mapped_column(Integer, nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    logical_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    stored_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    chunks: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    copy_s: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    write_s: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    error: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ManifestRow(Base):
    """One rank's part of an image: `entries` lists its tensors and their chunk hashes."""

    __tablename__ = "checkpoint_manifests"

    image_id: Mapped[str] = mapped_column(
        ForeignKey("checkpoint_images.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    entries: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    logical_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ImageChunkRow(Base):
    __tablename__ = "checkpoint_image_chunks"
    __table_args__ = (Index("ix_checkpoint_image_chunks_chunk", "chunk"),)

    image_id: Mapped[str] = mapped_column(
        ForeignKey("checkpoint_images.id", ondelete="CASCADE"), primary_key=True
    )
    chunk: Mapped[str] = mapped_column(
        ForeignKey("checkpoint_chunks.hash", ondelete="RESTRICT"), primary_key=True
    )


class OperationRow(Base):
    __tablename__ = "checkpoint_operations"
    __table_args__ = (
        Index("ix_checkpoint_operations_state", "state"),
        Index("ix_checkpoint_operations_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    # The caller's operation id: a retried request finds its first operation by it.
    request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # checkpoint | periodic | pause | resume | migrate
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    target_node: Mapped[str] = mapped_column(String(64), nullable=False, server_default="")
    image_id: Mapped[str | None] = mapped_column(String(40))
    reason: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    error: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
