"""Jobs larger than a node, GPU types and network topology.

- gpus.gpu_type: the type a node advertised for each GPU ("a100"; "" when unknown);
- nodes.labels: its place in the network ({"switch": "s1", "rack": "r2"});
- jobs.gang_nodes / placements.gang_nodes: the nodes of a gang in node-rank order (empty for
  a job on one node, whose node is jobs.node as before); jobs.gang_master: host:port of its
  rendezvous;
- gang_exits: one row per node of a gang whose rank group ended, so the api can tell when
  every node has finished (the job succeeds) or one failed (the whole gang stops).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("gpu_type", sa.String(32), nullable=False, server_default=""))
    op.add_column("nodes", sa.Column("labels", JSONB, nullable=False, server_default="{}"))
    op.add_column("jobs", sa.Column("gang_nodes", ARRAY(sa.String(64)), nullable=False, server_default="{}"))
    op.add_column("jobs", sa.Column("gang_master", sa.String(256), nullable=False, server_default=""))
    op.add_column("placements", sa.Column("gang_nodes", ARRAY(sa.String(64)), nullable=False, server_default="{}"))
    op.create_table(
        "gang_exits",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("epoch", sa.BigInteger, primary_key=True),
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("exit_code", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=False, server_default=""),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gang_exits")
    op.drop_column("placements", "gang_nodes")
    op.drop_column("jobs", "gang_master")
    op.drop_column("jobs", "gang_nodes")
    op.drop_column("nodes", "labels")
    op.drop_column("gpus", "gpu_type")
