"""Read model: the image a migrated job resumes from while it is still being written.

A migration of a job on one node resumes it as soon as the copy is taken: the target
streams the state from the source agent's staged copy while the durable write to the
chunk store goes on (rota.checkpoint.coordinator). `checkpoint_streamed_images` offers
that image, with the node whose agent holds the staged copy, for as long as its write
goes on; once written it is the job's newest complete image (checkpoint_resume_images),
and if the write fails the row goes and the job resumes from its last complete one.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-22
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE VIEW checkpoint_streamed_images AS
        SELECT DISTINCT ON (o.job_id) o.job_id, o.image_id, o.detail->>'node' AS source_node
        FROM checkpoint_operations o JOIN checkpoint_images i ON i.id = o.image_id
        WHERE o.kind = 'migrate' AND o.state = 'writing' AND i.state = 'writing'
          AND COALESCE((o.detail->>'streamed')::boolean, false)
        ORDER BY o.job_id, o.id DESC""")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS checkpoint_streamed_images")
