"""A gang's reports: one rank group per node, one job (the api's side of multi-node jobs).

Each node of a gang runs one rank group under the gang's one epoch and reports it like
any job. The job is RUNNING once any group runs; it SUCCEEDS only when every node's group
has exited 0 (each exit is kept in `gang_exits`, so a report repeated until the agent hears
the answer counts once); the first group that fails stops the whole gang: its GPUs are
released on its node and on every node whose group has ended, it is requeued or failed by its
restart policy, and the other agents, no longer assigned the job, stop their groups at their
next heartbeat; their GPUs stay claimed, and the gang unplaceable, until they report those
groups ended (or are declared dead). A group
that exited paused (at a safe point, its state copied) pauses the whole gang: the ranks
of every node voted together to stop there (`rota.runtime.state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.cluster.job_lifecycle import Events, pause, release, requeue_or_fail, transition
from rota.cluster.models import GangExitRow, GpuClaimRow, JobRow
from rota.core import jobstate, node_reports
from rota.core.node_reports import Outcome

if TYPE_CHECKING:
    from rota.cluster.heartbeats import JobReport


def apply_gang_report(session: Session, job: JobRow, node: str, report: JobReport, events: Events) -> None:
    """`report` is node `node`'s rank group of gang `job` (same epoch; row locked); what it
    means is `rota.core.node_reports.gang`'s."""
    # Progress is node rank 0's (where RANK 0 runs): one voice for the whole gang.
    if node == job.node and report.progress is not None and report.progress != job.progress:
        job.progress = report.progress
        events.add(job, "progress")
    code = report.exit_code if report.state != jobstate.SUCCEEDED else 0
    if report.state in (jobstate.SUCCEEDED, jobstate.FAILED):
        session.execute(
            insert(GangExitRow).values(job_id=job.id, epoch=job.epoch, node=node, exit_code=code,
                                       error=report.error[-4000:]).on_conflict_do_nothing()
        )
    done = session.scalar(select(func.count()).select_from(GangExitRow).where(
        GangExitRow.job_id == job.id, GangExitRow.epoch == job.epoch, GangExitRow.exit_code == 0)) \
        if report.state == jobstate.SUCCEEDED else 0
    meaning = node_reports.gang(job.state, report.state, int(done or 0), len(job.gang_nodes))
    if meaning.starts:
        transition(session, job, jobstate.RUNNING, f"started as a gang on {len(job.gang_nodes)} nodes "
                   f"({', '.join(job.gang_nodes)}) x GPUs {list(job.gpu_indices)}", events)
    if meaning.outcome is Outcome.PAUSE:
        # Its ranks exited at a safe point after every rank of every node copied its state
        # (their joint vote): the whole gang is paused; the coordinator records the image.
        pause(session, job, f"paused at step {job.progress.get('step', '?')} on all {len(job.gang_nodes)} nodes: "
                            "exited at a safe point", events)
    elif meaning.outcome is Outcome.SUCCEED:
        job.exit_code = 0
        release(session, job, "succeeded")
        transition(session, job, jobstate.SUCCEEDED, f"exit code 0 on all {len(job.gang_nodes)} nodes", events)
    elif meaning.outcome is Outcome.FAIL:
        fail_gang(session, job, node, report, events)


def fail_gang(session: Session, job: JobRow, node: str, report: JobReport, events: Events) -> None:
    """A failed group stops the gang. Its ranks on the other nodes may still run: their GPUs
    there stay claimed (`stopping_claims`) until those nodes report their groups ended, or
    are declared dead, and the gang is not placed again before (rota.cluster.planner_view
    leaves it out of the queue), so no old rank meets the next attempt's."""
    job.exit_code = report.exit_code
    job.error = f"[{node}] {report.error}"
    ended = set(session.scalars(select(GangExitRow.node).where(
        GangExitRow.job_id == job.id, GangExitRow.epoch == job.epoch)).all()) | {node}
    others = [n for n in job.gang_nodes if n not in ended]
    release(session, job, "failed", keep_nodes=others)
    why = f"rank group on {node} failed ({node_reports.failure_reason(report.exit_code, report.error)}); the whole gang stopped"
    if others:
        why += f", its ranks on {', '.join(others)} stop before it is placed again"
    requeue_or_fail(session, job, why, events)


def stopping_claims(session: Session, node: str) -> list[tuple[str, int]]:
    """(job, epoch) of the claims on `node` held for a stopped gang's ranks still running
    there: claims of a job that no longer holds GPUs (it released every other claim)."""
    rows = session.execute(
        select(GpuClaimRow.job_id, GpuClaimRow.epoch).distinct()
        .join(JobRow, JobRow.id == GpuClaimRow.job_id)
        .where(GpuClaimRow.node == node, JobRow.state.notin_(jobstate.HOLDING_STATES))
    ).all()
    return sorted(rows)


def settle_stopped_groups(session: Session, node: str, running: dict[tuple[str, int], str]) -> list[str]:
    """Frees `node`'s claims held for stopped gangs' ranks whose group `node` no longer
    reports running (`running`: (job, epoch) -> the state its report says); returns the
    jobs freed (the allocator may place them again)."""
    freed = [job_id for job_id, epoch in stopping_claims(session, node)
             if not node_reports.group_still_runs(running.get((job_id, epoch)))]
    if freed:
        session.execute(delete(GpuClaimRow).where(GpuClaimRow.node == node, GpuClaimRow.job_id.in_(freed)))
    return freed
