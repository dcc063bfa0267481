"""Realtime apps across nodes: each node's replicas, with the fencing epoch of their lease.

- jobs.replicas: a placed realtime app's {node: {"gpus": [...], "epoch": N}}, one entry
  per node it runs on. Each entry is a lease of its own (a placement row and its GPU
  claims under that epoch), so a resize on one node, or the loss of one node, touches that
  node's lease only. `node`, `gpu_indices` and `epoch` stay the home node's (the first
  entry's); `epoch` is the newest lease's. Empty ({}) for every other job.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("replicas", JSONB(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("jobs", "replicas")
