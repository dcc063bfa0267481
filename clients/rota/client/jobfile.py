"""Job files (YAML or JSON, SPEC §2) to the SDK's JobSpec (and its proto), with errors
that name the field."""

from __future__ import annotations

import json
import math
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from rota.client.errors import InvalidArgumentError
from rota.client.jobspec import CONDITIONS, KINDS, RESTARTS, Dependency, JobSpec
from rota.v1 import common_pb2

FIELDS = {
    "name", "tenant", "kind", "priority", "gpus", "command", "workdir", "env", "duration",
    "preemptible", "restart", "max_retries", "features", "demand", "max_swap", "accepts_layout_changes",
    "nodes", "gpus_per_node", "gpu_types", "gpu_type", "same_switch", "depends_on", "array", "gpu_memory_mb",
}
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def _bad(field: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{field}: {reason}", field=field)


def parse_duration(value: Any, field: str = "duration") -> float:
    """Seconds from `90`, `"90s"`, `"10m"`, `"1h30m"`."""
    if isinstance(value, bool):
        raise _bad(field, "must be a duration such as 10m, 1h30m or 90s")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not value.strip() or match is None:
            raise _bad(field, f"cannot read {value!r} as a duration (e.g. 10m, 1h30m, 90s)")
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    else:
        raise _bad(field, "must be a duration such as 10m, 1h30m or 90s")
    if not math.isfinite(seconds) or seconds <= 0:
        raise _bad(field, f"must be positive (got {value!r})")
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


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _bad(key, f"must be {what}")
    if not isinstance(value, kind):
        raise _bad(key, f"must be {what} (got {type(value).__name__})")
    return value


def job_spec_from_mapping(data: dict[str, Any], *, base_dir: Path | None = None) -> JobSpec:
    """A JobSpec from job-file fields, checking their types; a relative workdir is resolved
    against `base_dir` (default: the current directory). The server validates the values."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unknown field (known: {', '.join(sorted(FIELDS))})")
    fields: dict[str, Any] = {}
    for key in ("name", "tenant"):
        if key in data:
            fields[key] = str(_typed(data, key, str, "a string"))
    if "kind" in data:
        kind = _typed(data, "kind", str, "a string")
        if kind not in KINDS:
            raise _bad("kind", f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        fields["kind"] = kind
    for key in ("priority", "gpus", "max_retries", "max_swap", "nodes", "gpus_per_node", "gpu_memory_mb"):
        if key in data:
            fields[key] = _typed(data, key, int, "an integer")
    command = data.get("command", [])
    if isinstance(command, str):
        command = command.split()
    if not isinstance(command, list) or not all(isinstance(a, str | int | float) for a in command):
        raise _bad("command", "must be a list of strings")
    fields["command"] = tuple(str(a) for a in command)
    workdir = str(_typed(data, "workdir", str, "a string")) if "workdir" in data else "."
    base = base_dir or Path.cwd()
    fields["workdir"] = str((base / workdir).resolve()) if not os.path.isabs(workdir) else workdir
    if "env" in data:
        env = _typed(data, "env", dict, "a mapping")
        for key, value in env.items():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise _bad(f"env.{key}", "must be a string")
        fields["env"] = {str(k): str(v) for k, v in env.items()}
    if "duration" in data:
        seconds = parse_duration(data["duration"])
        try:
            fields["duration"] = timedelta(seconds=seconds)
        except OverflowError:
            raise _bad("duration", f"too long (got {data['duration']!r})") from None
    if "nodes" in data and "gpus" not in data:
        fields["gpus"] = 0  # the server sets it: nodes x gpus_per_node
    if "gpu_type" in data and "gpu_types" in data:
        raise _bad("gpu_type", "give gpu_type (one) or gpu_types (a list), not both")
    if "gpu_type" in data:
        fields["gpu_types"] = (str(_typed(data, "gpu_type", str, "a GPU type name such as a100")),)
    if "gpu_types" in data:
        types = _typed(data, "gpu_types", list, "a list of GPU type names")
        if not all(isinstance(t, str) for t in types):
            raise _bad("gpu_types", "must be a list of GPU type names such as [a100, h100]")
        fields["gpu_types"] = tuple(types)
    for key in ("preemptible", "accepts_layout_changes", "same_switch"):
        if key in data:
            fields[key] = _typed(data, key, bool, "true or false")
    if "restart" in data:
        restart = data["restart"]
        if restart not in RESTARTS:
            raise _bad("restart", f"one of {', '.join(RESTARTS)} (got {restart!r})")
        fields["restart"] = restart
    if "features" in data:
        fields["features"] = dict(_typed(data, "features", dict, "a mapping"))
    if "demand" in data:
        demand = _typed(data, "demand", list, "a list of GPU counts")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in demand):
            raise _bad("demand", "must be a list of integers")
        fields["demand"] = tuple(demand)
    if "depends_on" in data:
        fields["depends_on"] = _dependencies(data["depends_on"])
    array_of(data)  # checked here; `rota submit` and Client.submit_array send it
    return JobSpec(**fields)


def _dependencies(value: Any) -> tuple[Dependency, ...]:
    """`[{job: ID, when: succeeded}, ID, ...]` (a bare id waits for its success)."""
    items = value if isinstance(value, list) else [value]
    out: list[Dependency] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"job": item}
        if not isinstance(item, dict) or not isinstance(item.get("job"), str) or not item["job"]:
            raise _bad(f"depends_on[{i}].job", "each dependency needs a job id: {job: ID, when: succeeded}")
        unknown = sorted(set(item) - {"job", "when"})
        if unknown:
            raise _bad(f"depends_on[{i}].{unknown[0]}", "unknown field (known: job, when)")
        when = item.get("when", "succeeded")
        if when not in CONDITIONS:
            raise _bad(f"depends_on[{i}].when", f"one of {', '.join(CONDITIONS)} (got {when!r})")
        out.append(Dependency(item["job"], when))
    return tuple(out)


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


def spec_from_mapping(data: dict[str, Any], *, base_dir: Path | None = None) -> common_pb2.JobSpec:
    """Builds a JobSpec proto from job-file fields; the server validates the values again."""
    return job_spec_from_mapping(data, base_dir=base_dir).to_proto()
