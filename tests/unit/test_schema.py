"""rota.core.schema: each kind of error names the dotted field path and the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rota.core.errors import InvalidArgument
from rota.core.schema import Field, FieldError, Schema, SchemaError, check, validate


def _power_of_two(n: int) -> str | None:
    return None if n > 0 and n & (n - 1) == 0 else f"must be a power of two (got {n})"


def _gpus_fit_nodes(d: dict[str, Any]) -> list[tuple[str, str]]:
    if d.get("gpus", 0) > 8 * d.get("nodes", 1):
        return [("gpus", f"{d['gpus']} GPUs do not fit on {d.get('nodes', 1)} nodes")]
    return []


RESOURCES = Schema({
    "gpus": Field(kind=int, what="an integer", required=True, checks=(_power_of_two,)),
    "nodes": Field(kind=int, what="an integer", default=1, low=1, high=64),
    "types": Field(kind=list, what="a list", items=Field(kind=str, what="a string", min_len=1)),
}, checks=(_gpus_fit_nodes,))
BATCH = Schema({"kind": Field(choices=("batch", "realtime")), "duration": Field(kind=int, required=True, low=1)})
REALTIME = Schema({"kind": Field(choices=("batch", "realtime")),
                   "demand": Field(kind=list, required=True, min_len=1, items=Field(kind=int, low=0))})


def _job_kind(value: Mapping[str, Any]) -> Schema:
    return REALTIME if value.get("kind") == "realtime" else BATCH


JOB = Schema({
    "name": Field(kind=str, what="a string", required=True, min_len=1, max_len=8),
    "priority": Field(kind=int, what="an integer", default=5, low=1, high=10),
    "weight": Field(kind=(int, float), what="a number", low=0),
    "share": Field(kind=float, what="a number", high=1),
    "restart": Field(choices=("never", "on-failure"), default="never"),
    "preemptible": Field(kind=bool, what="true or false"),
    "resources": Field(kind=dict, what="a mapping", schema=RESOURCES),
    "env": Field(kind=dict, what="a mapping", values=Field(kind=str, type_reason="must be a string")),
    "command": Field(kind=list, what="a list of strings", convert=lambda v: v.split() if isinstance(v, str) else v),
    "stages": Field(kind=list, items=Field(kind=dict, schema=_job_kind)),
})
GOOD: dict[str, Any] = {"name": "ft", "resources": {"gpus": 4}}

BAD = [
    ("a wrong type", {"name": 3}, "name", "must be a string (got 3)"),
    ("a bool is not an integer", {"priority": True}, "priority", "must be an integer (got True)"),
    ("None is not a value", {"name": None}, "name", "must be a string (got None)"),
    ("below the range", {"priority": 0}, "priority", "must be between 1 and 10 (got 0)"),
    ("above the range", {"priority": 11}, "priority", "must be between 1 and 10 (got 11)"),
    ("below a floor", {"weight": -0.5}, "weight", "must be at least 0 (got -0.5)"),
    ("above a ceiling", {"share": 1.5}, "share", "must be at most 1 (got 1.5)"),
    ("not a number", {"share": float("nan")}, "share", "must be at most 1 (got nan)"),
    ("a choice not offered", {"restart": "always"}, "restart", "one of never, on-failure (got 'always')"),
    ("an empty string", {"name": ""}, "name", "must not be empty"),
    ("too long", {"name": "x" * 9}, "name", "more than 8 characters (has 9)"),
    ("a custom check, nested", {"resources": {"gpus": 3}}, "resources.gpus", "must be a power of two (got 3)"),
    ("a range, nested", {"resources": {"gpus": 4, "nodes": 0}}, "resources.nodes", "must be between 1 and 64 (got 0)"),
    ("a required field, nested", {"resources": {}}, "resources.gpus", "is required"),
    ("a nested mapping's type", {"resources": [4]}, "resources", "must be a mapping (got [4])"),
    ("a list item", {"resources": {"gpus": 4, "types": ["a100", 7]}}, "resources.types[1]", "must be a string (got 7)"),
    ("too short a list", {"stages": [{"kind": "realtime", "demand": []}]}, "stages[0].demand", "must not be empty"),
    ("an empty list item", {"resources": {"gpus": 4, "types": [""]}}, "resources.types[0]", "must not be empty"),
    ("a mapping check", {"resources": {"gpus": 16}}, "resources.gpus", "16 GPUs do not fit on 1 nodes"),
    ("a mapping's value", {"env": {"A": "1", "B": 2}}, "env.B", "must be a string"),
    ("a converted value", {"command": 5}, "command", "must be a list of strings (got 5)"),
    ("a tagged union's field", {"stages": [{"kind": "batch", "duration": 2}, {"kind": "realtime", "demand": [1, -1]}]},
     "stages[1].demand[1]", "must be at least 0 (got -1)"),
    ("a tagged union's required field", {"stages": [{"kind": "realtime"}]}, "stages[0].demand", "is required"),
    ("a tagged union's unknown field", {"stages": [{"kind": "batch", "duration": 1, "demand": [1]}]},
     "stages[0].demand", "unknown field (known: duration, kind)"),
    ("an unknown field", {"gpu": 2}, "gpu", "unknown field (known: command, env, name, preemptible, priority, "
     "resources, restart, share, stages, weight)"),
    ("an unknown field, nested", {"resources": {"gpus": 4, "gpu": 1}}, "resources.gpu",
     "unknown field (known: gpus, nodes, types)"),
]


@pytest.mark.parametrize(("case", "change", "path", "reason"), BAD, ids=[b[0] for b in BAD])
def test_each_error_names_the_field_and_the_reason(case: str, change: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(SchemaError) as err:
        validate(JOB, {**GOOD, **change})
    assert (err.value.field, err.value.reason) == (path, reason), case
    assert str(err.value) == f"{path}: {reason}"


def test_a_missing_required_field() -> None:
    with pytest.raises(SchemaError, match=r"^name: is required$"):
        validate(JOB, {"resources": {"gpus": 1}})


def test_the_checked_copy_has_defaults_and_conversions() -> None:
    out = validate(JOB, {**GOOD, "command": "python train.py", "stages": [{"kind": "realtime", "demand": [1, 2]}]})
    assert out == {"name": "ft", "priority": 5, "restart": "never", "resources": {"gpus": 4, "nodes": 1},
                   "command": ["python", "train.py"], "stages": [{"kind": "realtime", "demand": [1, 2]}]}
    assert "preemptible" not in out  # an optional field without a default stays absent


def test_a_default_list_is_not_shared() -> None:
    schema = Schema({"tags": Field(kind=list, default=[])})
    first = validate(schema, {})
    first["tags"].append("x")
    assert validate(schema, {}) == {"tags": []}


def test_every_error_is_collected_in_field_order_unknown_first() -> None:
    _, errors = check(JOB, {"name": 3, "priority": 0, "resources": {"gpus": 3, "extra": 1}, "zzz": 1})
    assert errors == [
        FieldError("zzz", "unknown field (known: command, env, name, preemptible, priority, resources, restart, "
                   "share, stages, weight)"),
        FieldError("name", "must be a string (got 3)"),
        FieldError("priority", "must be between 1 and 10 (got 0)"),
        FieldError("resources.extra", "unknown field (known: gpus, nodes, types)"),
        FieldError("resources.gpus", "must be a power of two (got 3)"),
    ]


def test_mapping_checks_wait_for_good_fields() -> None:
    _, errors = check(RESOURCES, {"gpus": 3, "nodes": 0})  # no "fit" check on bad figures
    assert [e.path for e in errors] == ["gpus", "nodes"]


def test_a_path_prefix_and_a_top_level_that_is_not_a_mapping() -> None:
    with pytest.raises(SchemaError, match=r"^spec\.resources\.gpus: must be a power"):
        validate(JOB, {"name": "a", "resources": {"gpus": 6}}, path="spec")
    with pytest.raises(SchemaError, match=r"^job: must be a mapping \(got list\)"):
        validate(JOB, [], path="job")


def test_an_open_schema_keeps_other_fields() -> None:
    schema = Schema({"a": Field(kind=int)}, closed=False)
    assert validate(schema, {"a": 1, "b": 2}) == {"a": 1, "b": 2}


def test_custom_reasons() -> None:
    schema = Schema({
        "kind": Field(kind=str, choices=("a", "b"), choices_reason="unknown kind {value}; one of {choices}"),
        "n": Field(kind=int, type_reason="needs {what}, not {value}", what="a count", low=1,
                   range_reason="{value} is below {low}"),
        "f": Field(required=True, missing_reason="missing (a callable)"),
    }, unknown_reason="not a field ({known})")
    _, errors = check(schema, {"kind": "c", "n": "x", "z": 0})
    assert [str(e) for e in errors] == [
        "z: not a field (f, kind, n)", "kind: unknown kind 'c'; one of a, b", "n: needs a count, not 'x'",
        "f: missing (a callable)"]
    assert str(check(schema, {"f": 1, "n": 0})[1][0]) == "n: 0 is below 1"


def test_a_schema_error_is_the_cores_invalid_argument_and_a_value_error() -> None:
    with pytest.raises(SchemaError) as err:
        validate(JOB, {"name": 1})
    assert isinstance(err.value, InvalidArgument) and isinstance(err.value, ValueError)
    assert err.value.code_name == "INVALID_ARGUMENT"
    assert err.value.errors == (FieldError("name", "must be a string (got 1)"),)


def test_a_long_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(SchemaError) as err:
        validate(JOB, {"name": ["x" * 200]})
    assert len(err.value.reason) < 100 and err.value.reason.endswith("...)")
