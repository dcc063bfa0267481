"""Job files (docs/design.md §2) to JobSpec protos: durations, field types, and the example files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rota.client._wire import spec_to_proto
from rota.client.errors import InvalidArgumentError
from rota.client.jobfile import job_spec_from_mapping, load_job_file, parse_duration
from rota.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def spec_from_mapping(data: dict[str, Any], *, base_dir: Path | None = None) -> common_pb2.JobSpec:
    """A job file's fields as the SDK sends them: read, then converted to the wire message."""
    return spec_to_proto(job_spec_from_mapping(data, base_dir=base_dir))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("10m", 600.0), ("1h30m", 5400.0), ("1h", 3600.0), ("90s", 90.0), ("2m30s", 150.0),
        ("1h0m5s", 3605.0), ("1.5h", 5400.0), (" 45s ", 45.0), (90, 90.0), (2.5, 2.5),
    ],
)
def test_durations(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    ["", "   ", "ten minutes", "10", "10x", "m", "30s1h", "-5m", "0s", "0", 0, -1, 0.0, True, None, [10], "1d"],
    ids=repr,
)
def test_bad_durations_name_the_field(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_duration(value)
    assert info.value.field == "duration"
    assert info.value.code == "INVALID_ARGUMENT"
    assert str(info.value).startswith("duration: ")


def base(**extra: Any) -> dict[str, Any]:
    return {"name": "ft", "tenant": "nlp", "command": ["python", "train.py"], **extra}


def test_full_mapping(tmp_path: Path) -> None:
    spec = spec_from_mapping(
        base(
            kind="batch_inference", priority=7, gpus=4, workdir="sub", env={"EXTRA": "1", "N": 2},
            duration="1h30m", preemptible=True, restart="on-failure", max_retries=2,
            features={"params": 1.3e9, "variant": "lora-sft"}, max_swap=1,
        ),
        base_dir=tmp_path,
    )
    assert spec.name == "ft" and spec.tenant == "nlp"
    assert spec.kind == common_pb2.JOB_KIND_BATCH_INFERENCE
    assert (spec.priority, spec.gpus, spec.max_retries, spec.max_swap) == (7, 4, 2, 1)
    assert list(spec.command) == ["python", "train.py"]
    assert spec.workdir == str((tmp_path / "sub").resolve())
    assert dict(spec.env) == {"EXTRA": "1", "N": "2"}
    assert spec.duration_seconds == 5400.0
    assert spec.preemptible is True
    assert spec.restart == common_pb2.RESTART_POLICY_ON_FAILURE
    assert spec.features["variant"] == "lora-sft"
    assert spec.features["params"] == 1.3e9


def test_defaults(tmp_path: Path) -> None:
    spec = spec_from_mapping({"command": "python run.py --x 1"}, base_dir=tmp_path)
    assert list(spec.command) == ["python", "run.py", "--x", "1"]
    assert spec.kind == common_pb2.JOB_KIND_TRAINING
    assert (spec.priority, spec.gpus) == (5, 1)
    assert spec.workdir == str(tmp_path.resolve())


def test_absolute_workdir_is_kept(tmp_path: Path) -> None:
    assert spec_from_mapping(base(workdir="/srv/jobs"), base_dir=tmp_path).workdir == "/srv/jobs"


def test_realtime_demand() -> None:
    spec = spec_from_mapping(base(kind="realtime", gpus=0, demand=[1, 2, 4]))
    assert spec.kind == common_pb2.JOB_KIND_REALTIME
    assert list(spec.demand) == [1, 2, 4]


BAD = [
    ("an unknown field", base(gpu=2), "gpu"),
    ("an unknown kind", base(kind="gaming"), "kind"),
    ("a kind that is not a string", base(kind=3), "kind"),
    ("a name that is not a string", base(name=12), "name"),
    ("a tenant that is a list", base(tenant=["a"]), "tenant"),
    ("gpus as a string", base(gpus="2"), "gpus"),
    ("gpus as a float", base(gpus=2.0), "gpus"),
    ("gpus as a bool", base(gpus=True), "gpus"),
    ("priority as a string", base(priority="high"), "priority"),
    ("max_retries as a float", base(max_retries=1.5), "max_retries"),
    ("max_swap as a string", base(max_swap="1"), "max_swap"),
    ("gpu_memory_mb as a string", base(gpu_memory_mb="4GiB"), "gpu_memory_mb"),
    ("a command that is a mapping", base(command={"a": 1}), "command"),
    ("a command with a nested list", base(command=["python", ["x"]]), "command"),
    ("a workdir that is a number", base(workdir=1), "workdir"),
    ("env that is a list", base(env=["A=1"]), "env"),
    ("an env value that is a mapping", base(env={"A": {"b": 1}}), "env.A"),
    ("an env value that is a bool", base(env={"A": True}), "env.A"),
    ("a bad duration", base(duration="soon"), "duration"),
    ("a zero duration", base(duration=0), "duration"),
    ("preemptible as a string", base(preemptible="yes"), "preemptible"),
    ("preemptible as a number", base(preemptible=1), "preemptible"),
    ("an unknown restart", base(restart="always"), "restart"),
    ("features as a list", base(features=[1]), "features"),
    ("demand as a number", base(kind="realtime", demand=4), "demand"),
    ("demand with strings", base(kind="realtime", demand=[1, "2"]), "demand"),
    ("demand with bools", base(kind="realtime", demand=[1, True]), "demand"),
    ("nodes as a string", base(nodes="2"), "nodes"),
    ("gpus_per_node as a float", base(nodes=2, gpus_per_node=4.0), "gpus_per_node"),
    ("a gpu_type that is a list", base(gpu_type=["a100"]), "gpu_type"),
    ("gpu_types as a string", base(gpu_types="a100"), "gpu_types"),
    ("gpu_types with a number", base(gpu_types=["a100", 100]), "gpu_types"),
    ("both gpu_type and gpu_types", base(gpu_type="a100", gpu_types=["h100"]), "gpu_type"),
    ("accepts_layout_changes as a string", base(accepts_layout_changes="no"), "accepts_layout_changes"),
    ("same_switch as a number", base(same_switch=0), "same_switch"),
    ("a dependency that is a number", base(depends_on=[7]), "depends_on[0].job"),
    ("a dependency with an empty id", base(depends_on=[{"job": ""}]), "depends_on[0].job"),
    ("an array that is a mapping", base(array={"from": 0}), "array"),
    ("a duration past any clock", base(duration=1e300), "duration"),
]


@pytest.mark.parametrize(("case", "data", "field"), BAD, ids=[c[0] for c in BAD])
def test_bad_fields_are_named(case: str, data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        spec_from_mapping(data)
    assert info.value.field == field, f"{case}: {info.value}"
    assert str(info.value).startswith(f"{field}: ")


def test_every_bad_field_is_told_at_once() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        spec_from_mapping(base(gpus="2", depends_on=[{"job": "j-1", "when": "later"}], colour="red"))
    assert info.value.field == "colour"  # unknown fields first: a misspelling explains the rest
    assert info.value.detail.splitlines() == [
        "also gpus: must be an integer (got '2')",
        "also depends_on[0].when: one of succeeded, finished, failed (got 'later')",
    ]


def test_an_unknown_field_lists_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^gpu: unknown field \(known: accepts_layout_changes, array, "):
        spec_from_mapping(base(gpu=2))


@pytest.mark.parametrize(
    ("filename", "content"),
    [
        ("bad.yaml", "name: [unclosed\n"),
        ("bad.json", "{not json"),
        ("list.yaml", "- a\n- b\n"),
        ("scalar.yaml", "just a string\n"),
        ("empty.yaml", ""),
    ],
)
def test_malformed_files(tmp_path: Path, filename: str, content: str) -> None:
    path = tmp_path / filename
    path.write_text(content)
    with pytest.raises(InvalidArgumentError) as info:
        load_job_file(path)
    assert info.value.field == "file"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        load_job_file(tmp_path / "nope.yaml")
    assert info.value.field == "file"


def test_json_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"name": "j", "tenant": "t", "gpus": 2, "command": ["true"], "duration": "90s"}')
    spec = spec_from_mapping(load_job_file(path), base_dir=tmp_path)
    assert (spec.name, spec.gpus, spec.duration_seconds) == ("j", 2, 90.0)


def test_there_are_example_job_files() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_job_files_parse(path: Path) -> None:
    data = load_job_file(path)
    spec = spec_from_mapping(data, base_dir=REPO)
    assert spec.name == data["name"]
    assert spec.command, "an example must have a command"
    if spec.nodes:  # a gang: the server sets gpus = nodes x gpus_per_node
        assert spec.gpus == 0 and spec.nodes & (spec.nodes - 1) == 0 and spec.gpus_per_node >= 1
    else:
        assert spec.gpus >= 1 and spec.gpus & (spec.gpus - 1) == 0
    assert 1 <= spec.priority <= 10
    # The scripts the examples run exist in the repository.
    scripts = [a for a in spec.command if a.endswith(".py")]
    assert all((REPO / s).is_file() for s in scripts), scripts
