"""The failure detector's verdicts with their evidence.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detector_verdicts",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(200), nullable=False, unique=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("iteration", sa.BigInteger(), nullable=False),
        sa.Column("ratio", sa.Float(), nullable=False),
        sa.Column("node", sa.String(64)),
        sa.Column("gpu", sa.Integer()),
        sa.Column("evidence", JSONB(), server_default="{}", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_detector_verdicts_job_id", "detector_verdicts", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_detector_verdicts_job_id", table_name="detector_verdicts")
    op.drop_table("detector_verdicts")
