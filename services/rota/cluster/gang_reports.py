"""A gang's reports: one rank group per node, one job (the api's side of multi-node jobs).

Each node of a gang runs one rank group under the gang's one epoch and reports it like
any job. The job is RUNNING once any group runs; it SUCCEEDS only when every node's group
has exited 0 (each exit is kept in `gang_exits`, so a report repeated until the agent hears
the answer counts once); the first group that fails stops the whole gang: its GPUs are
released on every node, it is requeued or failed by its restart policy, and the other
agents, no longer assigned the job, stop their groups at their next heartbeat. A group
that exited paused (at a safe point, its state copied) pauses the whole gang: the ranks
of every node voted together to stop there (`rota.runtime.state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.cluster.job_lifecycle import Events, pause, release, requeue_or_fail, transition
from rota.cluster.models import GangExitRow, JobRow
from rota.core import jobstate

if TYPE_CHECKING:
    from rota.cluster.heartbeats import JobReport


def apply_gang_report(session: Session, job: JobRow, node: str, report: JobReport, events: Events) -> None:
    """`report` is node `node`'s rank group of gang `job` (same epoch; row locked)."""
    # Progress is node rank 0's (where RANK 0 runs): one voice for the whole gang.
    if node == job.node and report.progress is not None and report.progress != job.progress:
        job.progress = report.progress
        events.add(job, "progress")
    if job.state == jobstate.SCHEDULED and report.state != jobstate.PENDING:
        transition(session, job, jobstate.RUNNING, f"started as a gang on {len(job.gang_nodes)} nodes "
                   f"({', '.join(job.gang_nodes)}) x GPUs {list(job.gpu_indices)}", events)
    if report.state == jobstate.PAUSED:
        # Its ranks exited at a safe point after every rank of every node copied its state
        # (their joint vote): the whole gang is paused; the coordinator records the image.
        pause(session, job, f"paused at step {job.progress.get('step', '?')} on all {len(job.gang_nodes)} nodes: "
                            "exited at a safe point", events)
        return
    if report.state not in (jobstate.SUCCEEDED, jobstate.FAILED):
        return
    code = report.exit_code if report.state != jobstate.SUCCEEDED else 0
    session.execute(
        insert(GangExitRow).values(job_id=job.id, epoch=job.epoch, node=node, exit_code=code, error=report.error[-4000:])
        .on_conflict_do_nothing()
    )
    if report.state == jobstate.SUCCEEDED:
        done = session.scalar(select(func.count()).select_from(GangExitRow).where(
            GangExitRow.job_id == job.id, GangExitRow.epoch == job.epoch, GangExitRow.exit_code == 0))
        if int(done or 0) >= len(job.gang_nodes):
            job.exit_code = 0
            release(session, job, "succeeded")
            transition(session, job, jobstate.SUCCEEDED, f"exit code 0 on all {len(job.gang_nodes)} nodes", events)
        return
    # A failed group stops the gang.
    why = f"exit code {report.exit_code}"
    job.exit_code = report.exit_code
    job.error = f"[{node}] {report.error}"
    release(session, job, "failed")
    requeue_or_fail(session, job, f"rank group on {node} failed ({why}); the whole gang stopped", events)
