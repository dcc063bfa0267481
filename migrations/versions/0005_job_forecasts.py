"""What each job was last planned on: forecast or declared duration (the allocator's).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_forecasts",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("planned_seconds", sa.Float()),
        sa.Column("declared_seconds", sa.Float()),
        sa.Column("model", sa.String(32), nullable=False),
        sa.Column("p50_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column("p90_seconds", sa.Float(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_forecasts")
