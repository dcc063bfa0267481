"""The GPU-time ledger: hour-split usage rows and the collector's bookmark per placement.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ledger_usage",
        sa.Column("lease_id", sa.String(64), primary_key=True),
        sa.Column("sequence", sa.BigInteger(), primary_key=True),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("start_at", TS, nullable=False),
        sa.Column("end_at", TS, nullable=False),
        sa.Column("recorded_at", TS, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("end_at >= start_at", name="ck_ledger_usage_span"),
        sa.CheckConstraint(
            "start_at >= to_timestamp(hour * 3600) AND end_at <= to_timestamp((hour + 1) * 3600)",
            name="ck_ledger_usage_within_hour",
        ),
        sa.CheckConstraint("cardinality(gpu_indices) > 0", name="ck_ledger_usage_gpus"),
    )
    op.create_index("ix_ledger_usage_tenant_hour", "ledger_usage", ["tenant", "hour"])
    op.create_index("ix_ledger_usage_hour", "ledger_usage", ["hour"])
    op.create_index("ix_ledger_usage_job_id", "ledger_usage", ["job_id"])
    op.create_table(
        "ledger_collected",
        sa.Column(
            "placement_id", sa.BigInteger(), sa.ForeignKey("placements.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("collected_until", TS, nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ledger_collected")
    op.drop_index("ix_ledger_usage_job_id", table_name="ledger_usage")
    op.drop_index("ix_ledger_usage_hour", table_name="ledger_usage")
    op.drop_index("ix_ledger_usage_tenant_hour", table_name="ledger_usage")
    op.drop_table("ledger_usage")
