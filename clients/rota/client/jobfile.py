"""Job files (YAML or JSON, SPEC §2) to JobSpec protos, with errors that name the field."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import struct_pb2

from rota.client.errors import InvalidArgumentError
from rota.v1 import common_pb2

KINDS = {
    "training": common_pb2.JOB_KIND_TRAINING,
    "batch_inference": common_pb2.JOB_KIND_BATCH_INFERENCE,
    "quantization": common_pb2.JOB_KIND_QUANTIZATION,
    "realtime": common_pb2.JOB_KIND_REALTIME,
    "trial": common_pb2.JOB_KIND_TRIAL,
}
RESTARTS = {"never": common_pb2.RESTART_POLICY_NEVER, "on-failure": common_pb2.RESTART_POLICY_ON_FAILURE}
FIELDS = {
    "name", "tenant", "kind", "priority", "gpus", "command", "workdir", "env", "duration",
    "preemptible", "restart", "max_retries", "features", "demand", "max_swap", "accepts_layout_changes",
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
    except (ValueError, yaml.YAMLError) as exc:
        raise _bad("file", f"{file} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise _bad("file", f"{file} must hold a mapping of job fields")
    return data


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _bad(key, f"must be {what}")
    if not isinstance(value, kind):
        raise _bad(key, f"must be {what} (got {type(value).__name__})")
    return value


def spec_from_mapping(data: dict[str, Any], *, base_dir: Path | None = None) -> common_pb2.JobSpec:
    """Builds a JobSpec from job-file fields; the server validates the values again."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unknown field (known: {', '.join(sorted(FIELDS))})")
    spec = common_pb2.JobSpec(priority=5, gpus=1)
    if "name" in data:
        spec.name = str(_typed(data, "name", str, "a string"))
    if "tenant" in data:
        spec.tenant = str(_typed(data, "tenant", str, "a string"))
    if "kind" in data:
        kind = _typed(data, "kind", str, "a string")
        if kind not in KINDS:
            raise _bad("kind", f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        spec.kind = KINDS[kind]
    else:
        spec.kind = common_pb2.JOB_KIND_TRAINING
    for key in ("priority", "gpus", "max_retries", "max_swap"):
        if key in data:
            setattr(spec, key, _typed(data, key, int, "an integer"))
    if "command" in data:
        command = data["command"]
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not all(isinstance(a, str | int | float) for a in command):
            raise _bad("command", "must be a list of strings")
        spec.command.extend(str(a) for a in command)
    workdir = str(_typed(data, "workdir", str, "a string")) if "workdir" in data else "."
    base = base_dir or Path.cwd()
    spec.workdir = str((base / workdir).resolve()) if not os.path.isabs(workdir) else workdir
    if "env" in data:
        env = _typed(data, "env", dict, "a mapping")
        for key, value in env.items():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise _bad(f"env.{key}", "must be a string")
            spec.env[str(key)] = str(value)
    if "duration" in data:
        spec.duration_seconds = parse_duration(data["duration"])
    if "preemptible" in data:
        spec.preemptible = _typed(data, "preemptible", bool, "true or false")
    if "accepts_layout_changes" in data:
        spec.accepts_layout_changes = _typed(data, "accepts_layout_changes", bool, "true or false")
    if "restart" in data:
        restart = data["restart"]
        if restart not in RESTARTS:
            raise _bad("restart", f"one of {', '.join(RESTARTS)} (got {restart!r})")
        spec.restart = RESTARTS[restart]
    if "features" in data:
        features = _typed(data, "features", dict, "a mapping")
        message = struct_pb2.Struct()
        message.update(features)
        spec.features.CopyFrom(message)
    if "demand" in data:
        demand = _typed(data, "demand", list, "a list of GPU counts")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in demand):
            raise _bad("demand", "must be a list of integers")
        spec.demand.extend(demand)
    return spec
