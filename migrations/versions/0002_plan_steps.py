"""Plan records: each committed step of the allocator's rolling horizon.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plan_steps",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("policy", sa.String(16), nullable=False),
        sa.Column("trigger", sa.String(128), nullable=False),
        sa.Column("step_seconds", sa.Float(), nullable=False),
        sa.Column("horizon", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.BigInteger(), nullable=False),
        sa.Column("figures", postgresql.JSONB(), nullable=False),
        sa.Column("assignments", postgresql.JSONB(), nullable=False),
        sa.Column("grid", postgresql.JSONB(), nullable=False),
        sa.Column("forecasts", postgresql.JSONB(), server_default="{}", nullable=False),
    )
    op.create_index("ix_plan_steps_created_at", "plan_steps", ["created_at"])


def downgrade() -> None:
    op.drop_table("plan_steps")
