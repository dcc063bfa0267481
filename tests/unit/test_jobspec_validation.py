"""Job spec validation (pure): every bad field is an InvalidArgument that names it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from rota.core.errors import InvalidArgument
from rota.core.jobspec import (
    DEFAULT_MAX_RETRIES,
    MAX_ARG_BYTES,
    MAX_ARGS,
    MAX_ENV,
    MAX_NAME,
    JobSpecData,
    gpus_to_hold,
    next_power_of_two,
    validate,
)

LARGEST_NODE = 8


def spec(**overrides: Any) -> JobSpecData:
    base = JobSpecData(
        name="ft-small",
        tenant="nlp",
        kind="training",
        priority=5,
        gpus=2,
        command=["python", "examples/train_lm.py", "--steps", "300"],
    )
    return replace(base, **overrides)


def realtime(**overrides: Any) -> JobSpecData:
    return spec(kind="realtime", **{"gpus": 0, "demand": [1, 2, 4], **overrides})


INVALID = [
    # (case, spec, field the error must name)
    ("an unknown kind", spec(kind="gaming"), "kind"),
    ("an empty kind", spec(kind=""), "kind"),
    ("a GPU count that is not a power of two", spec(gpus=3), "gpus"),
    ("zero GPUs for a batch job", spec(gpus=0), "gpus"),
    ("a negative GPU count", spec(gpus=-2), "gpus"),
    ("a gang of nodes that is not a power of two", spec(gpus=0, nodes=3, gpus_per_node=8), "nodes"),
    ("a gang whose GPUs per node exceed the largest node", spec(gpus=0, nodes=2, gpus_per_node=16), "gpus_per_node"),
    ("gpus_per_node without nodes", spec(gpus=16, gpus_per_node=8), "nodes"),
    ("gpus that disagree with nodes x gpus_per_node", spec(gpus=8, nodes=2, gpus_per_node=8), "gpus"),
    ("gpus per node not a power of two", spec(gpus=0, nodes=2, gpus_per_node=3), "gpus_per_node"),
    ("a realtime app across nodes", realtime(nodes=2, gpus_per_node=2), "nodes"),
    ("a GPU type that is no type name", spec(gpu_types=["A100 80GB"]), "gpu_types[0]"),
    ("a zero duration", spec(duration_seconds=0.0), "duration"),
    ("a negative duration", spec(duration_seconds=-5.0), "duration"),
    ("an infinite duration", spec(duration_seconds=math.inf), "duration"),
    ("a NaN duration", spec(duration_seconds=math.nan), "duration"),
    ("an empty command", spec(command=[]), "command"),
    ("an empty program name", spec(command=["", "x"]), "command[0]"),
    ("too many arguments", spec(command=["x"] * (MAX_ARGS + 1)), "command"),
    ("an oversized argument", spec(command=["python", "y" * (MAX_ARG_BYTES + 1)]), "command[1]"),
    ("priority zero", spec(priority=0), "priority"),
    ("priority above ten", spec(priority=11), "priority"),
    ("a negative priority", spec(priority=-1), "priority"),
    ("an oversized name", spec(name="n" * (MAX_NAME + 1)), "name"),
    ("a name with a space", spec(name="my job"), "name"),
    ("a name starting with a dash", spec(name="-job"), "name"),
    ("an empty tenant", spec(tenant=""), "tenant"),
    ("an oversized workdir", spec(workdir="/" + "w" * MAX_ARG_BYTES), "workdir"),
    ("too many env variables", spec(env={f"V{i}": "1" for i in range(MAX_ENV + 1)}), "env"),
    ("a ROTA_ env variable", spec(env={"ROTA_JOB_ID": "x"}), "env.ROTA_JOB_ID"),
    ("an invalid env name", spec(env={"1BAD": "x"}), "env.1BAD"),
    ("an oversized env value", spec(env={"BIG": "v" * (MAX_ARG_BYTES + 1)}), "env.BIG"),
    ("an unknown restart policy", spec(restart="always"), "restart"),
    ("too many retries", spec(restart="on-failure", max_retries=101), "max_retries"),
    ("negative retries", spec(max_retries=-1), "max_retries"),
    ("too many features", spec(features={f"f{i}": i for i in range(65)}), "features"),
    ("oversized features", spec(features={"blob": "b" * 17000}), "features"),
    ("a demand curve on a batch job", spec(demand=[1, 2]), "demand"),
    ("a realtime app with neither gpus nor demand", realtime(demand=[]), "gpus"),
    ("a realtime app with an all-zero demand", realtime(demand=[0, 0]), "gpus"),
    ("a realtime app with a negative demand step", realtime(demand=[1, -1]), "demand"),
    ("a realtime app with a too-long demand curve", realtime(demand=[1] * (24 * 7 * 4 + 1)), "demand"),
    ("a realtime app with a negative max_swap", realtime(max_swap=-1), "max_swap"),
    ("a realtime app with gpus not a power of two", realtime(gpus=3), "gpus"),
    ("a negative GPU memory", spec(gpu_memory_mb=-1), "gpu_memory_mb"),
    ("a GPU memory past any GPU", spec(gpu_memory_mb=1 << 25), "gpu_memory_mb"),
]


@pytest.mark.parametrize(("case", "bad", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_field_is_named(case: str, bad: JobSpecData, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate(bad, max_gpus_per_node=LARGEST_NODE)
    assert info.value.field == field, f"{case}: {info.value}"
    assert str(info.value).startswith(f"{field}: ")
    assert info.value.code_name == "INVALID_ARGUMENT"


def test_a_realtime_app_may_want_more_gpus_than_a_node_has() -> None:
    # One GPU per replica, on any nodes: its demand is not capped at the largest node.
    assert validate(realtime(demand=[2, 9]), max_gpus_per_node=LARGEST_NODE).demand == [2, 9]


def test_a_type_no_node_has_is_refused_naming_the_types() -> None:
    with pytest.raises(InvalidArgument, match=r"gpu_types: no node has GPUs of type h100 \(the cluster has a100, v100\)"):
        validate(spec(gpu_types=["h100"]), max_gpus_per_node=LARGEST_NODE, known_gpu_types=frozenset({"a100", "v100"}))
    ok = validate(spec(gpu_types=["h100", "a100", "a100"]), max_gpus_per_node=LARGEST_NODE,
                  known_gpu_types=frozenset({"a100"}))
    assert ok.gpu_types == ["a100", "h100"]


def test_with_no_node_registered_any_power_of_two_waits() -> None:
    assert validate(spec(gpus=64), max_gpus_per_node=0).gpus == 64


VALID = [
    ("the SPEC example", spec(), {}),
    ("one GPU on the largest node size", spec(gpus=8), {"gpus": 8}),
    ("priority bounds are inclusive (1)", spec(priority=1), {"priority": 1}),
    ("priority bounds are inclusive (10)", spec(priority=10), {"priority": 10}),
    ("a positive duration", spec(duration_seconds=600.0), {"duration_seconds": 600.0}),
    ("no name: derived from the script", spec(name="", command=["python", "dir/train lm.py", "--seed", "7"]),
     {"name": "train-lm"}),
    ("no name and no script: derived from the program", spec(name="", command=["/usr/bin/env"]),
     {"name": "env"}),
    ("on-failure with no retry count gets the default", spec(restart="on-failure"),
     {"max_retries": DEFAULT_MAX_RETRIES}),
    ("on-failure keeps an explicit retry count", spec(restart="on-failure", max_retries=7), {"max_retries": 7}),
    ("never keeps zero retries", spec(restart="never"), {"max_retries": 0}),
    ("a realtime app with a demand curve only", realtime(), {"gpus": 0}),
    ("a realtime app with gpus only", realtime(gpus=2, demand=[]), {"gpus": 2}),
    ("user env variables", spec(env={"EXTRA": "1", "_X": "y"}), {"env": {"EXTRA": "1", "_X": "y"}}),
    ("more GPUs than the largest node: a gang of whole nodes", spec(gpus=16), {"gpus": 16, "nodes": 0}),
    ("nodes x gpus_per_node sets gpus", spec(gpus=0, nodes=2, gpus_per_node=4),
     {"gpus": 8, "nodes": 2, "gpus_per_node": 4}),
    ("nodes with gpus spreads them", spec(gpus=16, nodes=4), {"gpus_per_node": 4}),
]


@pytest.mark.parametrize(("case", "good", "expected"), VALID, ids=[c[0] for c in VALID])
def test_valid_specs_are_normalised(case: str, good: JobSpecData, expected: dict[str, Any]) -> None:
    out = validate(good, max_gpus_per_node=LARGEST_NODE)
    for key, value in expected.items():
        assert getattr(out, key) == value, case


def test_realtime_holds_its_peak_rounded_up() -> None:
    assert gpus_to_hold(realtime(demand=[1, 3, 2])) == 4
    assert gpus_to_hold(realtime(gpus=2, demand=[1])) == 2
    assert gpus_to_hold(spec(gpus=4)) == 4
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 5, 8, 9)] == [1, 1, 2, 4, 8, 8, 16]


def test_digest_is_stable_across_equal_specs_and_dict_order() -> None:
    a = spec(env={"A": "1", "B": "2"}, features={"x": 1, "y": 2})
    b = spec(env={"B": "2", "A": "1"}, features={"y": 2, "x": 1})
    assert a.digest() == b.digest()
    assert a.digest() == JobSpecData.from_dict(a.to_dict()).digest()
    assert len(a.digest()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"name": "other"}, {"gpus": 4}, {"priority": 6}, {"command": ["python", "other.py"]},
        {"env": {"A": "2"}}, {"duration_seconds": 60.0}, {"restart": "on-failure"}, {"tenant": "cv"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_digest_changes_with_the_body(change: dict[str, Any]) -> None:
    assert spec(env={"A": "1"}).digest() != spec(**{"env": {"A": "1"}, **change}).digest()
