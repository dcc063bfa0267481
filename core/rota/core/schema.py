"""Declarative checks of plain mappings (job files, tuning specs, trace rows, scenarios) (pure).

A `Schema` names the fields a mapping may hold; each `Field` says the value's type, whether
it is required, its default, its range or choices, what its items or values must be, and
any custom checks. `check(schema, mapping)` returns the checked copy (defaults filled,
conversions applied) and every error found; `validate` raises the first as a `SchemaError`
whose message names the dotted field path and the reason::

    resources.gpus: must be a power of two (got 3)

The readers built on it (rota.client.jobfile, rota.tuning.space, rota.sim.workload,
rota.bench.detector_workload, rota.core.planning.scenario) keep their own exception
types: `SchemaError` is both the core's `InvalidArgument` (the server answers
INVALID_ARGUMENT with the field) and a `ValueError` (what the file readers raise).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rota.core.errors import InvalidArgument

__all__ = [
    "MISSING", "Check", "Field", "MappingCheck", "FieldError", "Schema", "SchemaError", "check", "describe", "join", "validate",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""A field's default when it has none: an absent optional field stays absent in the result."""

# A custom check: the reason the value is bad, or None when it is good.
Check = Callable[[Any], str | None]
# A mapping's check across its fields, run once each field is good: (field, reason) pairs,
# the field relative to the mapping ("" for the mapping itself).
MappingCheck = Callable[[dict[str, Any]], Iterable[tuple[str, str]]]


@dataclass(frozen=True)
class FieldError:
    """One bad field: its dotted path (`jobs[2].running.first_gpu`) and the reason."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class SchemaError(InvalidArgument, ValueError):
    """A mapping that does not fit its schema; the message is the first error, `errors` all."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.reason)
        self.errors = tuple(errors)


@dataclass(frozen=True)
class Field:
    """What one value must be. Messages read `<path>: <reason>`; every reason can be replaced.

    `kind` the accepted Python types (None: any; a bool is never an int or a float unless
    `bool` is named); `what` how a message names them ("an integer"). `convert` runs on the
    raw value before the checks (a command line given as one string split into a list).
    `low`/`high` bound a number (inclusive), `min_len`/`max_len` a list's, mapping's or
    string's length; `choices` the allowed values. `items` is what each element of a list
    must be, `values` each value of a mapping with free keys (the keys name the path),
    `schema` a nested mapping with named fields (or a function choosing it from the value,
    for a tagged union). `checks` run last, in order, on the converted value. An absent
    field takes `default` (a nested schema's default mapping gets that schema's own defaults).
    """

    kind: type | tuple[type, ...] | None = None
    what: str = ""
    required: bool = False
    nullable: bool = False  # None (JSON null) is kept as None, with no other check
    default: Any = MISSING
    convert: Callable[[Any], Any] | None = None
    choices: Sequence[Any] | None = None
    low: float | None = None
    high: float | None = None
    min_len: int | None = None
    max_len: int | None = None
    items: Field | None = None
    values: Field | None = None
    schema: Schema | Callable[[Mapping[str, Any]], Schema] | None = None
    checks: Sequence[Check] = ()
    missing_reason: str = "is required"
    type_reason: str = ""  # default: "must be {what} (got {value})"
    choices_reason: str = ""  # default: "one of {choices} (got {value})"
    range_reason: str = ""  # default: "must be between {low} and {high} (got {value})"


@dataclass(frozen=True)
class Schema:
    """The fields of a mapping, in the order they are checked. `closed`: any other key is an
    error naming it (`unknown_reason`, with `{known}` the known fields)."""

    fields: Mapping[str, Field]
    closed: bool = True
    unknown_reason: str = "unknown field (known: {known})"
    checks: Sequence[MappingCheck] = field(default_factory=tuple)


def join(path: str, key: str | int) -> str:
    """`path.key`, `path[i]` for an index, `key` at the top."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def describe(value: Any, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate(schema: Schema, mapping: Any, path: str = "") -> dict[str, Any]:
    """The checked copy of `mapping`, or SchemaError naming the first bad field."""
    result, errors = check(schema, mapping, path)
    if errors:
        raise SchemaError(errors)
    return result


def check(schema: Schema, mapping: Any, path: str = "") -> tuple[dict[str, Any], list[FieldError]]:
    """The checked copy of `mapping` and every error found, in the schema's field order
    (unknown fields first: a misspelt key explains the missing one after it)."""
    if not isinstance(mapping, Mapping):
        return {}, [FieldError(path, f"must be a mapping (got {type(mapping).__name__})")]
    errors = _unknown_fields(schema, mapping, path)
    result: dict[str, Any] = {} if schema.closed else dict(mapping)
    for name, spec in schema.fields.items():
        where = join(path, name)
        if name in mapping:
            value, found = _check_value(spec, mapping[name], where)
            errors += found
            if not found:
                result[name] = value
        elif spec.required:
            errors.append(FieldError(where, spec.missing_reason))
        elif spec.default is not MISSING and spec.schema is not None:
            result[name] = _check_value(spec, copy.copy(spec.default), where)[0]  # fills the nested defaults
        elif spec.default is not MISSING:
            result[name] = copy.copy(spec.default)  # a list default is not shared between results
    if not errors:
        for mapping_check in schema.checks:
            errors += [FieldError(join(path, key) if key else path, reason) for key, reason in mapping_check(result)]
    return result, errors


def _unknown_fields(schema: Schema, mapping: Mapping[Any, Any], path: str) -> list[FieldError]:
    if not schema.closed:
        return []
    known = ", ".join(sorted(schema.fields))
    reason = schema.unknown_reason.format(known=known)
    return [FieldError(join(path, str(key)), reason) for key in mapping if key not in schema.fields]


def _check_value(spec: Field, raw: Any, path: str) -> tuple[Any, list[FieldError]]:
    if raw is None and spec.nullable:
        return None, []
    value = spec.convert(raw) if spec.convert is not None else raw
    reason = _type_problem(spec, value) or _choice_problem(spec, value) or _range_problem(spec, value)
    if reason:
        return value, [FieldError(path, reason)]
    value, errors = _check_inside(spec, value, path)
    if errors:
        return value, errors
    for custom in spec.checks:
        reason = custom(value)
        if reason:
            return value, [FieldError(path, reason)]
    return value, []


def _type_problem(spec: Field, value: Any) -> str | None:
    if spec.kind is None:
        return None
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    is_bad_bool = isinstance(value, bool) and bool not in kinds
    if not is_bad_bool and isinstance(value, kinds):
        return None
    what = spec.what or " or ".join(k.__name__ for k in kinds)
    return (spec.type_reason or "must be {what} (got {value})").format(what=what, value=describe(value))


def _choice_problem(spec: Field, value: Any) -> str | None:
    if spec.choices is None or value in spec.choices:
        return None
    choices = ", ".join(str(c) for c in spec.choices)
    return (spec.choices_reason or "one of {choices} (got {value})").format(choices=choices, value=describe(value))


def _range_problem(spec: Field, value: Any) -> str | None:
    if spec.low is None and spec.high is None:
        return _length_problem(spec, value)
    low, high = spec.low, spec.high
    fits = not (isinstance(value, float) and math.isnan(value))
    fits = fits and (low is None or value >= low) and (high is None or value <= high)
    if fits:
        return None
    if spec.range_reason:
        return spec.range_reason.format(low=low, high=high, value=describe(value))
    if low is not None and high is not None:
        return f"must be between {low:g} and {high:g} (got {describe(value)})"
    if low is not None:
        return f"must be at least {low:g} (got {describe(value)})"
    return f"must be at most {high:g} (got {describe(value)})"


def _length_problem(spec: Field, value: Any) -> str | None:
    if spec.min_len is None and spec.max_len is None:
        return None
    length, unit = len(value), "characters" if isinstance(value, str) else "entries"
    if spec.min_len is not None and length < spec.min_len:
        return "must not be empty" if spec.min_len == 1 else f"needs at least {spec.min_len} {unit} (has {length})"
    if spec.max_len is not None and length > spec.max_len:
        return f"more than {spec.max_len} {unit} (has {length})"
    return None


def _check_inside(spec: Field, value: Any, path: str) -> tuple[Any, list[FieldError]]:
    """A list's items, a free mapping's values, a nested mapping's fields."""
    errors: list[FieldError] = []
    if spec.items is not None and isinstance(value, list | tuple):
        out = []
        for i, item in enumerate(value):
            checked, found = _check_value(spec.items, item, join(path, i))
            out.append(checked)
            errors += found
        return out, errors
    if spec.values is not None and isinstance(value, Mapping):
        checked_values = {}
        for key, item in value.items():
            checked, found = _check_value(spec.values, item, join(path, str(key)))
            checked_values[key] = checked
            errors += found
        return checked_values, errors
    if spec.schema is not None:
        nested = spec.schema
        if not isinstance(nested, Schema):  # a tagged union: the value says which schema
            nested = nested(value) if isinstance(value, Mapping) else Schema({})
        return check(nested, value, path)
    return value, errors
