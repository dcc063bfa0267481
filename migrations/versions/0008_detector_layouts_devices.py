"""Applied re-plan layouts per job, and devices taken out of the plan by the detector.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_layouts",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("layout", JSONB(), nullable=False),
        sa.Column("from_epoch", sa.BigInteger(), nullable=False),
        sa.Column("operation_id", sa.String(128), server_default="", nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "device_health",
        sa.Column("node", sa.String(64), sa.ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("gpu_index", sa.Integer(), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(512), server_default="", nullable=False),
        sa.Column("job_id", sa.String(32)),
        sa.Column("rank", sa.Integer()),
        sa.Column("kind", sa.String(16), server_default="", nullable=False),
        sa.Column("since", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("cleared_at", _TZ),
    )


def downgrade() -> None:
    op.drop_table("device_health")
    op.drop_table("job_layouts")
