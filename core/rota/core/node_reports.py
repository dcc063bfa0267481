"""What a node's report about a job it holds means: the rules, over plain data.

A node's agent reports each job it runs (its state, exit code, under the job's epoch on
that node). `rota.cluster.heartbeats` reads the rows, asks here what the report means and
writes the outcome. Three shapes of job:

- a job on one node: its report is the job's;
- a gang (one rank group per node under one epoch): it runs once any group runs; it
  succeeds only when every node's group has exited 0 (all or none); the first group that
  fails stops the whole gang; a group that exited paused pauses the whole gang (its ranks
  voted together to stop at a safe point);
- a realtime app with replicas on several nodes: replicas that end on one node end that
  node's lease only; the app ends (as a job on one node would) only with its last node.

No clock, no I/O: each rule is a function of its inputs, tested table-driven in
tests/unit/test_node_reports.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rota.core import jobstate


# What the job becomes after the report.
class Outcome(Enum):
    NONE = "none"  # nothing ends (still running, or a gang waiting for its other groups)
    SUCCEED = "succeed"  # released, SUCCEEDED
    FAIL = "fail"  # released, then requeued or failed by its restart policy
    PAUSE = "pause"  # released, PAUSED (its state was copied out at a safe point)
    END_NODE = "end_node"  # a realtime app: this node's replicas end, the app serves on


@dataclass(frozen=True)
class Meaning:
    """A report's meaning: whether it starts the job (SCHEDULED -> RUNNING), whether a
    gang's group exit is to be recorded, and what the job becomes."""

    starts: bool
    outcome: Outcome
    record_exit: bool = False


_ENDED = (jobstate.SUCCEEDED, jobstate.FAILED)


def single(job_state: str, report_state: str) -> Meaning:
    """A job on one node (or an app whose replicas are on that node alone)."""
    starts = job_state == jobstate.SCHEDULED and report_state in (*_ENDED, jobstate.RUNNING, jobstate.PAUSED)
    outcome = {jobstate.SUCCEEDED: Outcome.SUCCEED, jobstate.FAILED: Outcome.FAIL,
               jobstate.PAUSED: Outcome.PAUSE}.get(report_state, Outcome.NONE)
    return Meaning(starts, outcome)


def gang(job_state: str, report_state: str, groups_succeeded: int, nodes: int) -> Meaning:
    """One node's rank group of a gang of `nodes` nodes; `groups_succeeded` counts the
    groups of this epoch that exited 0, this report's included when it says SUCCEEDED."""
    starts = job_state == jobstate.SCHEDULED and report_state != jobstate.PENDING
    if report_state == jobstate.PAUSED:
        return Meaning(starts, Outcome.PAUSE)
    if report_state == jobstate.SUCCEEDED:
        return Meaning(starts, Outcome.SUCCEED if groups_succeeded >= nodes else Outcome.NONE, record_exit=True)
    if report_state == jobstate.FAILED:
        return Meaning(starts, Outcome.FAIL, record_exit=True)
    return Meaning(starts, Outcome.NONE)


def app_node(job_state: str, report_state: str) -> Meaning:
    """One node's replicas of an app that has replicas on other nodes too."""
    starts = job_state == jobstate.SCHEDULED and report_state in (*_ENDED, jobstate.RUNNING)
    ends = report_state in (*_ENDED, jobstate.PAUSED)
    return Meaning(starts, Outcome.END_NODE if ends else Outcome.NONE)


def group_still_runs(report_state: str | None) -> bool:
    """Whether a node's rank group of a stopped gang still runs, from that node's latest
    report about it (None: the node reports no such group: it never ran or has ended).
    Until it stops, its GPUs there stay claimed and the gang is not placed again."""
    return report_state in (jobstate.RUNNING, jobstate.PENDING)


# The first line of a failed report's error when the node itself ended the job (its limits,
# rota.agent.cgroups): the reason the job ends with, instead of its bare exit code.
NODE_VERDICTS = ("out of memory (", "time limit ", "refused: ")


def failure_reason(exit_code: int, error: str) -> str:
    """Why a failed report ended its job: the node's verdict (`out of memory (limit 4 GiB)`,
    `time limit 0:10:00 reached`, `refused: ...`) where the error opens with one, else
    `exit code N`."""
    first = error.split("\n", 1)[0].strip()
    return first if first.startswith(NODE_VERDICTS) else f"exit code {exit_code}"
