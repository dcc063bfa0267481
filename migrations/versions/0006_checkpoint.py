"""Checkpoint images, their per-rank manifests, the chunks they use, and durable operations.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "checkpoint_chunks",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("touched_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_checkpoint_chunks_touched_at", "checkpoint_chunks", ["touched_at"])
    op.create_table(
        "checkpoint_images",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("node", sa.String(64), server_default="", nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("logical_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("chunks", sa.Integer(), server_default="0", nullable=False),
        sa.Column("copy_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("write_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("completed_at", _TZ),
        sa.UniqueConstraint("job_id", "sequence", name="uq_checkpoint_images_job_sequence"),
    )
    op.create_index("ix_checkpoint_images_job_state", "checkpoint_images", ["job_id", "state"])
    op.create_table(
        "checkpoint_manifests",
        sa.Column("image_id", sa.String(40), sa.ForeignKey("checkpoint_images.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("entries", JSONB(), nullable=False),
        sa.Column("logical_bytes", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "checkpoint_image_chunks",
        sa.Column("image_id", sa.String(40), sa.ForeignKey("checkpoint_images.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("chunk", sa.String(64), sa.ForeignKey("checkpoint_chunks.hash", ondelete="RESTRICT"),
                  primary_key=True),
    )
    op.create_index("ix_checkpoint_image_chunks_chunk", "checkpoint_image_chunks", ["chunk"])
    op.create_table(
        "checkpoint_operations",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(128), unique=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("target_node", sa.String(64), server_default="", nullable=False),
        sa.Column("image_id", sa.String(40)),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("error", sa.Text(), server_default="", nullable=False),
        sa.Column("detail", JSONB(), server_default="{}", nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", _TZ),
    )
    op.create_index("ix_checkpoint_operations_state", "checkpoint_operations", ["state"])
    op.create_index("ix_checkpoint_operations_job_id", "checkpoint_operations", ["job_id"])


def downgrade() -> None:
    op.drop_table("checkpoint_operations")
    op.drop_table("checkpoint_image_chunks")
    op.drop_table("checkpoint_manifests")
    op.drop_table("checkpoint_images")
    op.drop_table("checkpoint_chunks")
