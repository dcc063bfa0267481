"""Job arrays and dependencies.

- job_arrays: one row per array submission (its tenant, name, task count, the cap on tasks
  running at once, and the request id and spec digest that make a retry idempotent);
- jobs.array_id / jobs.array_index: a task's array and index (NULL for any other job),
  indexed by (array_id, state) for the allocator's per-array counts, cancels and listings.

Dependencies need no table of their own: a job's `depends_on` is part of its spec (the
jobs.spec JSON), which the allocator reads for every waiting job already.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-15
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_arrays",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), sa.ForeignKey("tenants.name"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=False, server_default="0"),
        sa.Column("request_id", sa.String(128)),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("tenant", "request_id", name="uq_job_arrays_tenant_request_id"),
    )
    op.add_column("jobs", sa.Column("array_id", sa.String(32), sa.ForeignKey("job_arrays.id")))
    op.add_column("jobs", sa.Column("array_index", sa.Integer))
    op.create_index("ix_jobs_array_state", "jobs", ["array_id", "state"],
                    postgresql_where=sa.text("array_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_jobs_array_state", table_name="jobs")
    op.drop_column("jobs", "array_index")
    op.drop_column("jobs", "array_id")
    op.drop_table("job_arrays")
