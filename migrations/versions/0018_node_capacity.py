"""A node's CPU and memory capacity, which jobs' `cpus` and `memory` reserve (issue 35).

- nodes.cpus: the CPUs its agent reported (discovered, or declared with --cpus); 0: not
  reported, nothing is checked;
- nodes.memory_bytes: its memory in bytes (MemTotal, or --memory); 0: not reported.

A job's own `cpus`, `memory` and `time_limit` travel in its spec (jobs.spec, JSON): no column.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("cpus", sa.Float(), nullable=False, server_default="0"))
    op.add_column("nodes", sa.Column("memory_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("nodes", "memory_bytes")
    op.drop_column("nodes", "cpus")
