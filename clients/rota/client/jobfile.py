"""Job files (YAML or JSON, docs/design.md §2) to the SDK's JobSpec, with errors that name the field."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from rota.client.errors import InvalidArgumentError
from rota.client.jobspec import CONDITIONS, KINDS, RESTARTS, Dependency, JobSpec
from rota.core.schema import Check, Field, Schema, SchemaError, validate

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def _bad(field: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{field}: {reason}", field=field)


def _duration_seconds(value: Any) -> float | str:
    """Seconds from `90`, `"90s"`, `"10m"`, `"1h30m"`, or the reason the value is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return "must be a duration such as 10m, 1h30m or 90s"
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not value.strip() or match is None:
            return f"cannot read {value!r} as a duration (e.g. 10m, 1h30m, 90s)"
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        return f"must be positive (got {value!r})"
    return seconds


def parse_duration(value: Any, field: str = "duration") -> float:
    """Seconds from `90`, `"90s"`, `"10m"`, `"1h30m"`."""
    seconds = _duration_seconds(value)
    if isinstance(seconds, str):
        raise _bad(field, seconds)
    return seconds


def load_job_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise _bad("file", f"cannot read {file}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(file, exc) from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise _bad("file", f"{file} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise _bad("file", f"{file} must hold a mapping of job fields")
    return data


def _yaml_error(file: Path, exc: yaml.MarkedYAMLError) -> InvalidArgumentError:
    """One line: the file, the line and column of the problem, the parser's reason, and
    what it was reading when it met it (`while parsing a flow sequence` begun where)."""
    where = exc.problem_mark or exc.context_mark
    at = f", line {where.line + 1}, column {where.column + 1}" if where is not None else ""
    problem = exc.problem or exc.context or "cannot parse"
    context = ""
    if exc.problem and exc.context:
        began = exc.context_mark
        since = f" at line {began.line + 1}, column {began.column + 1}" if began is not None and began != where else ""
        context = f" ({exc.context}{since})"
    return _bad("file", f"{file}{at}: not valid YAML: {problem}{context}")


def _scalars(reason: str, kinds: type | tuple[type, ...], *, bools: bool = False) -> Check:
    """A check that every item of a list is one of `kinds` (a bool only with `bools`)."""
    def problem(values: list[Any]) -> str | None:
        ok = all(isinstance(v, kinds) and (bools or not isinstance(v, bool)) for v in values)
        return None if ok else reason
    return problem


def _duration_problem(value: Any) -> str | None:
    seconds = _duration_seconds(value)
    if isinstance(seconds, str):
        return seconds
    try:
        timedelta(seconds=seconds)
    except OverflowError:
        return f"too long (got {value!r})"
    return None


def _array_problem(value: Any) -> str | None:
    try:
        array_of({"array": value})
    except InvalidArgumentError as exc:
        return exc.message.removeprefix("array: ")
    return None


def _one_gpu_type_field(data: dict[str, Any]) -> list[tuple[str, str]]:
    if "gpu_type" in data and "gpu_types" in data:
        return [("gpu_type", "give gpu_type (one) or gpu_types (a list), not both")]
    return []


_STRING = Field(kind=str, what="a string")
_INTEGER = Field(kind=int, what="an integer")
_FLAG = Field(kind=bool, what="true or false")
_NEEDS_JOB = "each dependency needs a job id: {job: ID, when: succeeded}"
DEPENDENCY = Schema({
    "job": Field(kind=str, required=True, missing_reason=_NEEDS_JOB, type_reason=_NEEDS_JOB.replace("{", "{{").replace("}", "}}"),
                 checks=(lambda job: None if job else _NEEDS_JOB,)),
    "when": Field(choices=tuple(CONDITIONS), default="succeeded"),
}, unknown_reason="unknown field (known: {known})")
JOB_FILE = Schema({
    "name": _STRING, "tenant": _STRING,
    "kind": Field(kind=str, what="a string", choices=tuple(KINDS), choices_reason="unknown kind {value}; one of {choices}"),
    **{key: _INTEGER for key in ("priority", "gpus", "max_retries", "max_swap", "nodes", "gpus_per_node", "gpu_memory_mb")},
    "command": Field(kind=list, what="a list of strings", default=[], convert=lambda v: v.split() if isinstance(v, str) else v,
                     type_reason="must be a list of strings",
                     checks=(_scalars("must be a list of strings", (str, int, float), bools=True),)),
    "workdir": Field(kind=str, what="a string", default="."),
    "env": Field(kind=dict, what="a mapping", values=Field(kind=(str, int, float), type_reason="must be a string")),
    "duration": Field(checks=(_duration_problem,)),
    "time_limit": Field(checks=(_duration_problem,)),
    "cpus": Field(kind=(int, float), what="a number of CPUs such as 2 or 0.5"),
    # The server reads the quantity (rota.core.quantities) and names it when it cannot.
    "memory": Field(kind=(str, int), what="a quantity such as 256Mi or 4Gi"),
    "gpu_type": Field(kind=str, what="a GPU type name such as a100"),
    "gpu_types": Field(kind=list, what="a list of GPU type names",
                       checks=(_scalars("must be a list of GPU type names such as [a100, h100]", str),)),
    **{key: _FLAG for key in ("preemptible", "accepts_layout_changes", "same_switch")},
    "restart": Field(choices=tuple(RESTARTS)),
    "features": Field(kind=dict, what="a mapping"),
    "demand": Field(kind=list, what="a list of GPU counts", checks=(_scalars("must be a list of integers", int),)),
    # `[{job: ID, when: succeeded}, ID, ...]` (a bare id waits for its success; one alone is a list of one).
    "depends_on": Field(convert=lambda v: v if isinstance(v, list) else [v], items=Field(
        convert=lambda item: item if isinstance(item, dict) else {"job": item}, schema=DEPENDENCY)),
    "array": Field(checks=(_array_problem,)),  # `rota submit` and Client.submit_array send it
}, checks=(_one_gpu_type_field,))
FIELDS = set(JOB_FILE.fields)


# A checked field as JobSpec holds it (the others as they are).
_AS_SPEC: dict[str, Callable[[Any], Any]] = {
    "command": lambda command: tuple(str(a) for a in command),
    "env": lambda env: {str(k): str(v) for k, v in env.items()},
    "duration": lambda duration: timedelta(seconds=parse_duration(duration)),
    "time_limit": lambda limit: timedelta(seconds=parse_duration(limit, "time_limit")),
    "cpus": float,
    "gpu_types": tuple, "demand": tuple, "features": dict,
    "depends_on": lambda deps: tuple(Dependency(d["job"], d["when"]) for d in deps),
}


def job_spec_from_mapping(data: dict[str, Any], *, base_dir: Path | None = None) -> JobSpec:
    """A JobSpec from job-file fields, checking their types; a relative workdir is resolved
    against `base_dir` (default: the current directory). The server validates the values."""
    try:
        checked = validate(JOB_FILE, data)
    except SchemaError as exc:
        error = _bad(exc.field, exc.reason)
        error.detail = "\n".join(f"also {other}" for other in exc.errors[1:])  # every bad field at once
        raise error from None
    fields = {key: _AS_SPEC.get(key, _same)(value) for key, value in checked.items() if key not in ("gpu_type", "array")}
    workdir = checked["workdir"]
    fields["workdir"] = workdir if os.path.isabs(workdir) else str(((base_dir or Path.cwd()) / workdir).resolve())
    if "nodes" in checked and "gpus" not in checked:
        fields["gpus"] = 0  # the server sets it: nodes x gpus_per_node
    if "gpu_type" in checked:
        fields["gpu_types"] = (checked["gpu_type"],)
    return JobSpec(**fields)


def _same(value: Any) -> Any:
    return value


def array_of(data: dict[str, Any]) -> str | None:
    """A job file's `array:` (`0-99%4`, `1,3,5-9`, or a list of indices) as the wire's text;
    None when it has none. The server checks the indices."""
    if "array" not in data:
        return None
    value = data["array"]
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return ",".join(str(i) for i in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise _bad("array", "a range such as 0-99 (optionally %K), a list such as 1,3,5-9, or a list of integers")
    return value


def load_job_spec(path: str | os.PathLike[str], *, base_dir: Path | None = None) -> JobSpec:
    """A job file read as a JobSpec (`base_dir`: what a relative workdir is relative to,
    default the current directory, as for `rota submit`)."""
    return job_spec_from_mapping(load_job_file(path), base_dir=base_dir)
