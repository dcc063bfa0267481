"""Tenant quotas (guaranteed, limit, per-type limits, a parent) and users inside tenants.

- tenants: `guaranteed` GPUs (0: none), `gpu_limit` (NULL: no cap), `gpu_type_limits`
  ({type: GPUs}), `parent` (another tenant: a department over its groups);
- tenant_users: a tenant's users, each with its own token (hashed), expiry, revocation,
  last use, and whether it administers its tenant (a tenant admin);
- jobs.submitted_by: the user whose token submitted the job ("" or NULL: the tenant's token
  or the admin's); cluster_jobs shows it as `submitted_by` (the ledger's usage by user).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CLUSTER_JOBS = (
    "SELECT id AS job_id, tenant, name, kind, state, reason, priority, gpus, spec, progress, created_at,"
    " started_at, finished_at, array_id,"
    " EXISTS (SELECT 1 FROM job_arrays a WHERE a.id = jobs.array_id AND a.max_running > 0) AS array_capped"
)


def upgrade() -> None:
    op.add_column("tenants", sa.Column("guaranteed", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("tenants", sa.Column("gpu_limit", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("gpu_type_limits", JSONB(), nullable=False, server_default="{}"))
    op.add_column("tenants", sa.Column("parent", sa.String(64), sa.ForeignKey("tenants.name"), nullable=True))
    op.create_check_constraint("ck_tenants_quota", "tenants",
                               "guaranteed >= 0 AND (gpu_limit IS NULL OR gpu_limit >= guaranteed)")
    op.create_table(
        "tenant_users",
        sa.Column("tenant", sa.String(64), sa.ForeignKey("tenants.name"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("token_hash", sa.String(64), unique=True),
        sa.Column("token_expires_at", sa.DateTime(timezone=True)),
        sa.Column("tenant_admin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.Column("last_used_at", sa.DateTime(timezone=True)),
    )
    op.add_column("jobs", sa.Column("submitted_by", sa.String(64), nullable=True))
    op.execute(f"CREATE OR REPLACE VIEW cluster_jobs AS {CLUSTER_JOBS}, submitted_by FROM jobs")


def downgrade() -> None:
    op.execute("DROP VIEW cluster_jobs")
    op.execute(f"CREATE VIEW cluster_jobs AS {CLUSTER_JOBS} FROM jobs")
    op.drop_column("jobs", "submitted_by")
    op.drop_table("tenant_users")
    op.drop_constraint("ck_tenants_quota", "tenants")
    for column in ("parent", "gpu_type_limits", "gpu_limit", "guaranteed"):
        op.drop_column("tenants", column)
