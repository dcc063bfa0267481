"""The cluster state's read models: what the ledger and the forecaster read of `jobs`,
`placements`, `job_transitions`, `nodes` and `gpus`, which rota.cluster alone writes
(docs/architecture.md, Read models). The views' columns are rota.cluster's contract; its
tables may change behind them.

- cluster_jobs: every job's identity, state and reason, size, spec, reported progress, times, its
  array and whether that array caps how many of its tasks run at once;
- cluster_job_leases: every placement (a lease of GPUs) with its job's tenant; a gang's
  lists its nodes, a guest's names its host and when it took the GPUs over;
- cluster_requeues: when each requeued job last went back to PENDING;
- cluster_pause_moves: each job's moves into and out of PAUSED (its paused spells);
- cluster_alive_gpus: the GPUs of the nodes alive now.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

VIEWS = {
    "cluster_jobs": (
        "SELECT id AS job_id, tenant, name, kind, state, reason, priority, gpus, spec, progress, created_at,"
        " started_at, finished_at, array_id,"
        " EXISTS (SELECT 1 FROM job_arrays a WHERE a.id = jobs.array_id AND a.max_running > 0) AS array_capped"
        " FROM jobs"
    ),
    "cluster_job_leases": (
        "SELECT p.id AS placement_id, p.job_id, j.tenant, p.node, p.gang_nodes, p.gpu_indices, p.guest_of,"
        " p.created_at, p.promoted_at, p.released_at FROM placements p JOIN jobs j ON j.id = p.job_id"
    ),
    "cluster_requeues": (
        "SELECT job_id, max(at) AS requeued_at FROM job_transitions WHERE to_state = 'PENDING' GROUP BY job_id"
    ),
    "cluster_pause_moves": (
        "SELECT id AS transition_id, job_id, from_state, to_state, at FROM job_transitions"
        " WHERE to_state = 'PAUSED' OR from_state = 'PAUSED'"
    ),
    "cluster_alive_gpus": (
        "SELECT g.node, g.index AS gpu_index FROM gpus g JOIN nodes n ON n.name = g.node WHERE n.health = 'ALIVE'"
    ),
}


def upgrade() -> None:
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {query}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
