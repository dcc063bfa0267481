"""Arrays and dependencies on the client side: job-file fields, the SDK's index text and
dependency protos, and the `rota jobs` row that folds an array's tasks."""

from __future__ import annotations

from typing import Any

import pytest

from rota.cli.array_commands import grouped_table, with_after
from rota.client import Dependency, InvalidArgumentError, JobArray, JobSpec, job_spec_from_mapping
from rota.client._wire import spec_to_proto
from rota.client.arrays import indices_text
from rota.client.jobfile import array_of
from rota.v1 import common_pb2

BASE = {"name": "t", "command": ["true"]}


@pytest.mark.parametrize(("indices", "text"), [
    (range(100), "0-99"), (range(0, 100, 5), "0-95:5"), ([1, 3, 5], "1,3,5"), ("0-9%2", "0-9%2"), (range(0), ""),
])
def test_indices_as_the_wire_text(indices: Any, text: str) -> None:
    assert indices_text(indices) == text


@pytest.mark.parametrize(("value", "text"), [("0-99%4", "0-99%4"), ([1, 2, 5], "1,2,5"), (7, "7")])
def test_a_job_files_array_field(value: Any, text: str) -> None:
    assert array_of({**BASE, "array": value}) == text
    job_spec_from_mapping({**BASE, "array": value})  # accepted beside the job's own fields


def test_a_bad_array_field_names_it() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        job_spec_from_mapping({**BASE, "array": {"from": 0}})
    assert err.value.field == "array"


def test_depends_on_in_a_job_file_and_on_the_wire() -> None:
    spec = job_spec_from_mapping({**BASE, "depends_on": ["j-1", {"job": "j-2", "when": "failed"}]})
    assert spec.depends_on == (Dependency("j-1"), Dependency("j-2", "failed"))
    wire = spec_to_proto(spec)
    assert [(d.job, d.when) for d in wire.depends_on] == [
        ("j-1", common_pb2.DEPENDENCY_CONDITION_SUCCEEDED), ("j-2", common_pb2.DEPENDENCY_CONDITION_FAILED)]
    after = with_after(spec, ["j-2", "j-3"])
    assert [(d.job, d.when) for d in spec_to_proto(after).depends_on] == [
        ("j-1", common_pb2.DEPENDENCY_CONDITION_SUCCEEDED), ("j-2", common_pb2.DEPENDENCY_CONDITION_FAILED),
        ("j-3", common_pb2.DEPENDENCY_CONDITION_SUCCEEDED)]


@pytest.mark.parametrize(("raw", "field"), [
    ([{"job": "j-1", "when": "afterok"}], "depends_on[0].when"),
    ([{"when": "failed"}], "depends_on[0].job"),
    ([{"job": "j-1", "after": "x"}], "depends_on[0].after"),
])
def test_bad_dependencies_in_a_file_name_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        job_spec_from_mapping({**BASE, "depends_on": raw})
    assert err.value.field == field


def test_an_unknown_condition_in_the_sdk_names_the_field() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        spec_to_proto(JobSpec(command=["true"], depends_on=[Dependency("j-1", "sometimes")]))
    assert err.value.field == "depends_on[0].when"


def test_jobs_folds_an_array_into_one_row() -> None:
    class Task:  # the fields of a Job the grouping reads
        def __init__(self, i: int) -> None:
            self.id, self.array_id = f"j-a_{i}", "j-a"

    array = JobArray("j-a", "demo", "sweep", 3, 2, states={"RUNNING": 2, "PENDING": 1})
    text = grouped_table([Task(0), Task(1), Task(2)], [array], lambda jobs: f"{len(jobs)} jobs")  # type: ignore[list-item]
    assert "j-a" in text and "running=2 pending=1" in text and "j-a_1" not in text
