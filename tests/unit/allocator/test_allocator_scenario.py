"""The scenario validator rejects malformed files with a message naming the field."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rota.core.planning.scenario import REALTIME, ScenarioError, from_dict, load, to_dict

SCENARIOS = Path(__file__).resolve().parents[3] / "bench" / "scenarios"


def base() -> dict[str, Any]:
    return {
        "name": "t", "gpus": 8, "gpus_per_node": 8, "horizon": 4,
        "jobs": [
            {"id": "ft", "kind": "training", "priority": 5, "gpus": 4, "duration": 3, "arrival": 0},
            {"id": "run", "kind": "training", "gpus": 2, "duration": 5, "running": {"started": -1, "first_gpu": 4}},
            {"id": "chat", "kind": "realtime", "demand": [1, 2, 2, 1], "max_swap": 1},
        ],
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(base())
    *head, last = path.split(".")
    node: Any = d
    for key in head:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return d


BAD = [
    ("cluster GPUs that are not a power of two", "gpus", 12, "gpus"),
    ("a job's GPUs that are not a power of two", "jobs.0.gpus", 3, "jobs[0].gpus"),
    ("a job larger than the cluster", "jobs.0.gpus", 16, "jobs[0].gpus"),
    ("a demand curve shorter than the horizon", "jobs.2.demand", [1, 2], "jobs[2].demand"),
    ("a demand above the cluster", "jobs.2.demand", [1, 2, 9, 1], "jobs[2].demand[2]"),
    ("a running job on a misaligned block", "jobs.1.running.first_gpu", 3, "jobs[1].running.first_gpu"),
    ("a running job outside the cluster", "jobs.1.running.first_gpu", 8, "jobs[1].running.first_gpu"),
    ("a running job that has not started yet", "jobs.1.running.started", 2, "jobs[1].running.started"),
    ("a running job that already finished", "jobs.1.running.started", -5, "jobs[1].running.started"),
    ("an unknown kind", "jobs.0.kind", "render", "jobs[0].kind"),
    ("a negative arrival", "jobs.0.arrival", -1, "jobs[0].arrival"),
    ("a zero duration", "jobs.0.duration", 0, "jobs[0].duration"),
    ("a priority out of range", "jobs.0.priority", 11, "jobs[0].priority"),
    ("a negative swap cap", "jobs.2.max_swap", -1, "jobs[2].max_swap"),
    ("a duplicate id", "jobs.2.id", "ft", "jobs[2].id"),
    ("a decay above one", "decay", 1.5, "decay"),
    ("a non-integer GPU count", "jobs.0.gpus", 2.5, "jobs[0].gpus"),
    ("a GPU count that is a bool", "jobs.0.gpus", True, "jobs[0].gpus"),
    ("nodes larger than the cluster", "gpus_per_node", 16, "gpus_per_node"),
    ("a zero horizon", "horizon", 0, "horizon"),
    ("a horizon that is a string", "horizon", "4", "horizon"),
    ("a zero step", "step_seconds", 0, "step_seconds"),
    ("a negative realtime penalty", "realtime_penalty", -1, "realtime_penalty"),
    ("a decay that is a string", "decay", "high", "decay"),
    ("jobs that are a mapping", "jobs", {"ft": {}}, "jobs"),
    ("a job that is a list", "jobs.0", ["ft"], "jobs[0]"),
    ("an empty id", "jobs.0.id", "", "jobs[0].id"),
    ("a priority that is a string", "jobs.0.priority", "high", "jobs[0].priority"),
    ("a running entry that is a list", "jobs.1.running", [0, 4], "jobs[1].running"),
    ("a running start that is a float", "jobs.1.running.started", -0.5, "jobs[1].running.started"),
    ("gpu types that are not a list", "jobs.0.gpu_types", "a100", "jobs[0].gpu_types"),
    ("an empty gpu type", "jobs.0.gpu_types", [""], "jobs[0].gpu_types"),
    ("same_switch as a number", "jobs.0.same_switch", 1, "jobs[0].same_switch"),
    ("a demand that is not a list", "jobs.2.demand", 2, "jobs[2].demand"),
    ("a held GPU outside the cluster", "jobs.2.held", [0, 8], "jobs[2].held[1]"),
    ("held GPUs twice", "jobs.2.held", [1, 1], "jobs[2].held"),
    ("node types, not one per node", "node_types", ["a100", "h100"], "node_types"),
    ("node switches that are not strings", "node_switches", [1], "node_switches"),
    ("an unknown top-level field", "gpu", 8, "gpu"),
    ("an unknown job field", "jobs.0.colour", "red", "jobs[0].colour"),
    ("a batch field on a realtime app", "jobs.2.duration", 3, "jobs[2].duration"),
    ("a realtime field on a batch job", "jobs.0.demand", [1, 1, 1, 1], "jobs[0].demand"),
]


@pytest.mark.parametrize(("case", "path", "value", "field"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_scenario_is_rejected_naming_the_field(case: str, path: str, value: Any, field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        from_dict(with_change(path, value))
    assert err.value.field == field
    assert str(err.value).startswith(field)


def test_a_job_whose_types_no_node_has_is_rejected() -> None:
    d = with_change("node_types", ["a100"])
    d["jobs"][0]["gpu_types"] = ["h100"]
    with pytest.raises(ScenarioError, match="no node has GPUs of type h100") as err:
        from_dict(d)
    assert err.value.field == "jobs[0].gpu_types"


def test_running_jobs_on_overlapping_blocks_are_rejected() -> None:
    d = base()
    d["jobs"].append({"id": "run2", "kind": "training", "gpus": 4, "duration": 2,
                      "running": {"started": 0, "first_gpu": 4}})
    with pytest.raises(ScenarioError, match="GPU 4 is already held by running job run") as err:
        from_dict(d)
    assert err.value.field == "jobs[3].running.first_gpu"


def test_a_valid_scenario_loads_with_defaults_and_round_trips() -> None:
    s = from_dict(base())
    assert (s.decay, s.realtime_penalty, s.step_seconds) == (0.97, 8.0, 3600)
    assert [j.id for j in s.batch] == ["ft", "run"] and s.realtime[0].kind == REALTIME
    assert from_dict(to_dict(s)) == s


def test_a_file_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ScenarioError, match="is not valid JSON"):
        load(bad)


def test_the_seven_benchmark_scenarios_are_valid() -> None:
    files = sorted(SCENARIOS.glob("*.json"))
    assert len(files) == 7
    for f in files:
        s = load(f)
        assert s.name == f.stem
        assert json.loads(f.read_text())["horizon"] == s.horizon == 24


def test_a_realtime_apps_gpu_types_load_and_round_trip() -> None:
    d = with_change("jobs.2.gpu_types", ["h100"])
    s = from_dict(d)
    assert s.realtime[0].gpu_types == frozenset({"h100"})
    assert from_dict(to_dict(s)) == s


@pytest.mark.parametrize(("change", "field"), [
    (("jobs.0.gpus", 3), "scenario_json.jobs[0].gpus"),
    (("jobs.0.colour", "red"), "scenario_json.jobs[0].colour"),
])
def test_the_plan_rpc_answers_invalid_argument_naming_the_field(change: tuple[str, Any], field: str) -> None:
    from rota.allocator.service import AllocatorService
    from rota.core.errors import InvalidArgument
    from rota.v1 import allocator_pb2

    service = AllocatorService(db=None, settings=None)  # type: ignore[arg-type]  # refused before either is used
    request = allocator_pb2.PlanRequest(scenario_json=json.dumps(with_change(*change)), policy="fast")
    with pytest.raises(InvalidArgument) as err:
        asyncio.run(service.Plan(request, context=None))  # type: ignore[arg-type]
    assert err.value.field == field and err.value.code_name == "INVALID_ARGUMENT"
