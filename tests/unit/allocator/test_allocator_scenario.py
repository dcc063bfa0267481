"""The scenario validator rejects malformed files with a message naming the field."""

from __future__ import annotations

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
]


@pytest.mark.parametrize(("case", "path", "value", "field"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_scenario_is_rejected_naming_the_field(case: str, path: str, value: Any, field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        from_dict(with_change(path, value))
    assert err.value.field == field
    assert str(err.value).startswith(field)


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
