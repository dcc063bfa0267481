"""What a node's report means (rota.core.node_reports), table-driven: a job on one node,
a gang's rank group, an app's replicas on one of several nodes, a stopped gang's group."""

from __future__ import annotations

import pytest

from rota.core import jobstate as js
from rota.core import node_reports as nr
from rota.core.node_reports import Outcome

SINGLE = [
    # job state, report, starts, outcome
    (js.SCHEDULED, js.PENDING, False, Outcome.NONE),
    (js.SCHEDULED, js.RUNNING, True, Outcome.NONE),
    (js.SCHEDULED, js.SUCCEEDED, True, Outcome.SUCCEED),  # ended before any heartbeat saw it run
    (js.SCHEDULED, js.FAILED, True, Outcome.FAIL),
    (js.SCHEDULED, js.PAUSED, True, Outcome.PAUSE),
    (js.RUNNING, js.RUNNING, False, Outcome.NONE),
    (js.RUNNING, js.SUCCEEDED, False, Outcome.SUCCEED),
    (js.RUNNING, js.FAILED, False, Outcome.FAIL),
    (js.RUNNING, js.PAUSED, False, Outcome.PAUSE),
]


@pytest.mark.parametrize(("job", "report", "starts", "outcome"), SINGLE)
def test_a_job_on_one_node(job: str, report: str, starts: bool, outcome: Outcome) -> None:
    assert nr.single(job, report) == nr.Meaning(starts, outcome)


GANG = [
    # job state, report, groups that exited 0 (this one included), nodes, starts, outcome, exit recorded
    (js.SCHEDULED, js.PENDING, 0, 2, False, Outcome.NONE, False),
    (js.SCHEDULED, js.RUNNING, 0, 2, True, Outcome.NONE, False),
    (js.RUNNING, js.RUNNING, 0, 2, False, Outcome.NONE, False),
    (js.RUNNING, js.SUCCEEDED, 1, 2, False, Outcome.NONE, True),  # all or none: the other group runs on
    (js.RUNNING, js.SUCCEEDED, 2, 2, False, Outcome.SUCCEED, True),
    (js.RUNNING, js.SUCCEEDED, 3, 3, False, Outcome.SUCCEED, True),
    (js.RUNNING, js.FAILED, 0, 2, False, Outcome.FAIL, True),  # one failed group stops the gang
    (js.RUNNING, js.FAILED, 1, 3, False, Outcome.FAIL, True),  # even after others succeeded
    (js.SCHEDULED, js.FAILED, 0, 2, True, Outcome.FAIL, True),
    (js.RUNNING, js.PAUSED, 0, 2, False, Outcome.PAUSE, False),  # the ranks voted together
]


@pytest.mark.parametrize(("job", "report", "done", "nodes", "starts", "outcome", "recorded"), GANG)
def test_a_gangs_rank_group(job: str, report: str, done: int, nodes: int, starts: bool, outcome: Outcome,
                            recorded: bool) -> None:
    assert nr.gang(job, report, done, nodes) == nr.Meaning(starts, outcome, record_exit=recorded)


APP = [
    (js.SCHEDULED, js.PENDING, False, Outcome.NONE),
    (js.SCHEDULED, js.RUNNING, True, Outcome.NONE),
    (js.RUNNING, js.RUNNING, False, Outcome.NONE),
    (js.RUNNING, js.SUCCEEDED, False, Outcome.END_NODE),  # that node's lease only: the app serves on
    (js.RUNNING, js.FAILED, False, Outcome.END_NODE),
    (js.RUNNING, js.PAUSED, False, Outcome.END_NODE),
    (js.SCHEDULED, js.PAUSED, False, Outcome.END_NODE),
]


@pytest.mark.parametrize(("job", "report", "starts", "outcome"), APP)
def test_an_apps_replicas_on_one_of_its_nodes(job: str, report: str, starts: bool, outcome: Outcome) -> None:
    assert nr.app_node(job, report) == nr.Meaning(starts, outcome)


@pytest.mark.parametrize(("report", "runs"), [
    (js.RUNNING, True), (js.PENDING, True), (js.FAILED, False), (js.SUCCEEDED, False), (js.PAUSED, False),
    (None, False),  # the node reports no such group: it never ran there, or has ended
])
def test_a_stopped_gangs_group_runs_until_its_node_reports_it_ended(report: str | None, runs: bool) -> None:
    assert nr.group_still_runs(report) is runs
