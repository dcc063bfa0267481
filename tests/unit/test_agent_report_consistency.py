"""An agent's job report pairs a state with the exit code it was derived from.

CI once saw `fail.yaml` reach FAILED with "exit code 0": the report read the exit code
while the job still ran (None, sent as 0), and then the state after it had exited
(FAILED). The report must come from one read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.agent.processes import LocalJob
from rota.agent.service import report_of
from rota.v1 import common_pb2


class ExitsBetweenReads(LocalJob):
    """A job whose process exits with `code` right after the first read of its exit."""

    def __init__(self, folder: Path, code: int) -> None:
        super().__init__(job_id="j-1", epoch=1, gpus=[0], pgid=0, folder=folder)
        self.reads = 0
        self.code = code

    def exit_code(self) -> int | None:
        self.reads += 1
        return None if self.reads == 1 else self.code


@pytest.mark.parametrize("code", [1, 0])
def test_a_job_that_exits_between_reads_is_reported_as_one_read_saw_it(tmp_path: Path, code: int) -> None:
    report = report_of(ExitsBetweenReads(tmp_path, code))
    assert report.state == common_pb2.JOB_STATE_RUNNING
    assert report.exit_code == 0


@pytest.mark.parametrize(("code", "state"), [(1, common_pb2.JOB_STATE_FAILED), (0, common_pb2.JOB_STATE_SUCCEEDED)])
def test_a_finished_job_is_reported_with_its_own_code(tmp_path: Path, code: int, state: int) -> None:
    job = ExitsBetweenReads(tmp_path, code)
    job.reads = 1  # already exited
    report = report_of(job)
    assert (report.state, report.exit_code) == (state, code)
