"""Trials placed in the pipeline bubbles of running jobs (Hydro's bubble squeezing).

- gpu_guests: a GPU lent to a guest trial while its host job holds it; keyed by (node,
  gpu_index) like gpu_claims, so a GPU takes one guest at most whatever any allocator
  believes;
- jobs.guest_of: the host job of a job running as a guest ('' for every other job);
- placements.guest_of / placements.promoted_at: a guest's placement names its host; once
  the host has ended and the guest took the GPUs as their holder, promoted_at says when.
  The ledger bills a guest placement from promoted_at only: until then its GPU-seconds
  are the host's, already billed to the host's tenant.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("guest_of", sa.String(32), nullable=False, server_default=""))
    op.add_column("placements", sa.Column("guest_of", sa.String(32), nullable=False, server_default=""))
    op.add_column("placements", sa.Column("promoted_at", sa.DateTime(timezone=True)))
    op.create_table(
        "gpu_guests",
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("gpu_index", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("host_job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("placement_id", sa.BigInteger, sa.ForeignKey("placements.id", ondelete="CASCADE"), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpu_guests")
    op.drop_column("placements", "promoted_at")
    op.drop_column("placements", "guest_of")
    op.drop_column("jobs", "guest_of")
