"""GPU-time weighted by GPU type: the ledger's per-row types and rates, and the read model
the ledger learns the types from.

- ledger_usage.gpu_types / gpu_rates (aligned with gpu_indices) and weighted_gpus (their
  sum): what a row's GPUs were and counted for when it was first written. Existing rows are
  left as they are (no rewrite of a large table): empty arrays and NULL mean one per GPU,
  which is how they were charged;
- node_gpu_types (node lifecycle): the type each registered GPU advertised ("" unknown),
  read by the ledger instead of the `gpus` table (docs/architecture.md, Read models).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

VIEWS = {
    # Node lifecycle: the type each GPU of each registered node advertised ("" when unknown).
    "node_gpu_types": "SELECT node, index AS gpu_index, gpu_type FROM gpus",
}


def upgrade() -> None:
    op.add_column("ledger_usage", sa.Column("gpu_types", ARRAY(sa.String(32)), nullable=False, server_default="{}"))
    op.add_column("ledger_usage", sa.Column("gpu_rates", ARRAY(sa.Numeric()), nullable=False, server_default="{}"))
    op.add_column("ledger_usage", sa.Column("weighted_gpus", sa.Numeric(), nullable=True))
    op.create_check_constraint(
        "ck_ledger_usage_rates", "ledger_usage",
        "cardinality(gpu_types) IN (0, cardinality(gpu_indices))"
        " AND cardinality(gpu_rates) IN (0, cardinality(gpu_indices))"
        " AND (weighted_gpus IS NULL OR weighted_gpus > 0)",
    )
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {query}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_constraint("ck_ledger_usage_rates", "ledger_usage", type_="check")
    op.drop_column("ledger_usage", "weighted_gpus")
    op.drop_column("ledger_usage", "gpu_rates")
    op.drop_column("ledger_usage", "gpu_types")
