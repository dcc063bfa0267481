"""Initial schema: tenants, jobs with their state history, nodes, GPUs, placements, claims.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.execute("CREATE SEQUENCE rota_epoch_seq")
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("token_hash", sa.String(64), unique=True),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), sa.ForeignKey("tenants.name"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(128)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("node", sa.String(64)),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), server_default="{}", nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("error", sa.Text(), server_default="", nullable=False),
        sa.Column("progress", postgresql.JSONB(), server_default="{}", nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.UniqueConstraint("tenant", "request_id", name="uq_jobs_tenant_request_id"),
    )
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at"])
    op.create_index("ix_jobs_node", "jobs", ["node"])
    op.create_table(
        "job_transitions",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", TS, server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_job_transitions_job_id", "job_transitions", ["job_id"])
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("health", sa.String(16), nullable=False),
        sa.Column("last_heartbeat", TS, nullable=False),
        sa.Column("registered_at", TS, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "gpus",
        sa.Column("node", sa.String(64), sa.ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("virtual", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "placements",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False, unique=True),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.Column("released_at", TS),
        sa.Column("release_reason", sa.Text(), server_default="", nullable=False),
    )
    op.create_index("ix_placements_job_id", "placements", ["job_id"])
    op.create_table(
        "gpu_claims",
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("gpu_index", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "placement_id", sa.BigInteger(), sa.ForeignKey("placements.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_gpu_claims_job_id", "gpu_claims", ["job_id"])


def downgrade() -> None:
    op.drop_table("gpu_claims")
    op.drop_table("placements")
    op.drop_table("gpus")
    op.drop_table("nodes")
    op.drop_table("job_transitions")
    op.drop_table("jobs")
    op.drop_table("tenants")
    op.execute("DROP SEQUENCE rota_epoch_seq")
