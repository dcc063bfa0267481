"""Read models: the views a service publishes for the others to read (docs/architecture.md).

A service owns its tables; another service that needs some of that data reads one of these
views, never the tables. The view is the owner's contract: the owner may change its tables
as long as the view keeps its columns and meaning (`rota.common.read_models` declares them,
tests/integration/test_read_models.py checks them against rows the owner wrote).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

VIEWS = {
    # Checkpoint service: the image a job restarted now restores from (its newest complete one).
    "checkpoint_resume_images": """
        SELECT DISTINCT ON (job_id) job_id, id AS image_id, sequence, write_s, copy_s, logical_bytes
        FROM checkpoint_images WHERE state = 'complete'
        ORDER BY job_id, sequence DESC""",
    # Checkpoint service: what moving a job costs, measured: its resume image's write and copy
    # times and the pause times of its last five pauses or migrations (newest first).
    "checkpoint_move_costs": """
        SELECT r.job_id, r.write_s, r.copy_s, r.logical_bytes,
               COALESCE((SELECT array_agg(p.pause_s ORDER BY p.id DESC)
                         FROM (SELECT o.id, (o.detail->>'pause_s')::float8 AS pause_s
                               FROM checkpoint_operations o
                               WHERE o.job_id = r.job_id AND o.kind IN ('pause', 'migrate')
                                 AND o.state IN ('writing', 'resuming', 'done')
                               ORDER BY o.id DESC LIMIT 5) p
                         WHERE p.pause_s > 0), '{}'::float8[]) AS recent_pauses_s
        FROM checkpoint_resume_images r""",
    # Checkpoint service: the node a job's latest resume or migration asked for ('' if none).
    "checkpoint_resume_targets": """
        SELECT DISTINCT ON (job_id) job_id, target_node
        FROM checkpoint_operations WHERE kind IN ('resume', 'migrate')
        ORDER BY job_id, id DESC""",
    # Detector: GPUs out of every plan until an operator clears them.
    "detector_bad_gpus": "SELECT node, gpu_index FROM device_health WHERE state = 'BAD'",
    # Detector: the layout an applied re-plan gave a job (its ROTA_LAYOUT at the next launch).
    "detector_applied_layouts": "SELECT job_id, layout, from_epoch FROM job_layouts",
}


def upgrade() -> None:
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {query}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
