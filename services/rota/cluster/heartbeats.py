"""What a node's heartbeat means: its reports applied to the jobs it holds, under its epochs.

The rules (which report ends a job how) are `rota.core.node_reports`'s; a gang's reports are
`gang_reports`', a realtime app's on several nodes `app_reports`'."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from rota.cluster import app_replicas, app_reports, gang_reports, node_lifecycle
from rota.cluster.job_lifecycle import (
    Events,
    on_node,
    pause,
    release,
    requeue_or_fail,
    transition,
)
from rota.cluster.models import (
    JobRow,
    NodeRow,
)
from rota.core import jobstate, node_reports
from rota.core.node_reports import Outcome


@dataclass
class JobReport:
    job_id: str
    epoch: int
    state: str
    exit_code: int
    error: str
    progress: dict[str, object] | None


def heartbeat(
    session: Session, node_name: str, reports: Sequence[JobReport], events: Events
) -> tuple[NodeRow, Sequence[JobRow]]:
    """Applies an agent's reports and returns what the control plane has placed on the node.

    Reports from an older placement (epoch or node differ) are ignored: the job has been
    requeued and placed again, and the answer tells that agent to stop its copy.
    """
    node = node_lifecycle.beat(session, node_name)
    # One locked read of what the node holds serves both the reports and the answer (a
    # query per report cost about a millisecond of CPU each): a report about anything
    # else (requeued, placed elsewhere, finished) changes nothing.
    held = session.scalars(
        select(JobRow)
        .where(on_node(node_name), JobRow.state.in_(jobstate.HOLDING_STATES))
        .order_by(JobRow.id)
        .with_for_update()
    ).all()
    by_id = {job.id: job for job in held}
    for report in reports:
        job = by_id.get(report.job_id)
        if job is None or app_replicas.node_epoch(job, node_name) != report.epoch:  # an app: this node's lease's
            continue
        if job.gang_nodes:
            gang_reports.apply_gang_report(session, job, node_name, report, events)
        elif not app_replicas.is_app(job):
            _apply_report(session, job, report, events)
        elif (alone := app_reports.apply_node_report(session, job, node_name, report, events)) is not None:
            _apply_report(session, job, alone, events)  # an app on this node alone
    _record_cancelled_exits(session, node_name, [r for r in reports if r.job_id not in by_id])
    # A stopped gang's ranks here that have ended free their GPUs: the gang may be placed again.
    if gang_reports.settle_stopped_groups(session, node_name, {(r.job_id, r.epoch): r.state for r in reports}):
        events.gpus_freed = True
    assigned = [job for job in held if job.state in jobstate.HOLDING_STATES]
    return node, assigned


def _record_cancelled_exits(session: Session, node_name: str, reports: Sequence[JobReport]) -> None:
    """The exit code of a cancelled job's process (143 after SIGTERM). A cancel commits
    CANCELLED before the api stops the process, so the stopped process's report comes
    after the job let go of its GPUs; it is kept when it is of the cancelled placement
    (epoch and node) and the first one (a gang's other nodes report too)."""
    for report in reports:
        if report.state not in (jobstate.SUCCEEDED, jobstate.FAILED):
            continue
        session.execute(
            update(JobRow)
            .where(JobRow.id == report.job_id, JobRow.epoch == report.epoch, JobRow.state == jobstate.CANCELLED,
                   JobRow.exit_code.is_(None), on_node(node_name))
            .values(exit_code=report.exit_code)
        )


def _apply_report(session: Session, job: JobRow, report: JobReport, events: Events) -> None:
    """A single-node job's report (a gang's: rota.cluster.gang_reports)."""
    if report.progress is not None and report.progress != job.progress:
        job.progress = report.progress
        events.add(job, "progress")
    meaning = node_reports.single(job.state, report.state)
    if meaning.starts:
        transition(session, job, jobstate.RUNNING, f"started on {job.node} GPUs {list(job.gpu_indices)}", events)
    if meaning.outcome is Outcome.SUCCEED:
        job.exit_code = report.exit_code
        release(session, job, "succeeded")
        transition(session, job, jobstate.SUCCEEDED, "exit code 0", events)
    elif meaning.outcome is Outcome.PAUSE:
        # The job exited at a safe point after every rank's state was copied out: the
        # checkpoint coordinator records the image; the GPUs are free from now on.
        pause(session, job, f"paused at step {job.progress.get('step', '?')}: exited at a safe point", events)
    elif meaning.outcome is Outcome.FAIL:
        job.exit_code = report.exit_code
        job.error = report.error
        release(session, job, "failed")
        requeue_or_fail(session, job, node_reports.failure_reason(report.exit_code, report.error), events)
