"""The forecaster's observations: completed jobs and hourly traffic samples.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "forecast_completions",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(160), nullable=False, unique=True),
        sa.Column("job_id", sa.String(32)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("features", postgresql.JSONB(), server_default="{}", nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("declared_seconds", sa.Float()),
        sa.Column("duration_seconds", sa.Float(), nullable=False),
        sa.Column("observed_at", TS, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "forecast_traffic",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(160), nullable=False, unique=True),
        sa.Column("app", sa.String(128), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("at_unix", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.Float(), nullable=False),
        sa.Column("observed_at", TS, server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_forecast_traffic_app_hour", "forecast_traffic", ["app", "hour"])


def downgrade() -> None:
    op.drop_table("forecast_traffic")
    op.drop_table("forecast_completions")
