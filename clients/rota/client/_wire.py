"""The SDK's types to and from the wire's messages (rota.v1 protos): the one place that
knows both. Private: the SDK's public signatures take and return its own types alone
(tests/unit/test_client_public_types.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, struct_pb2

from rota.client.enums import JobKind, JobState
from rota.client.errors import InvalidArgumentError
from rota.client.jobspec import Dependency, JobSpec
from rota.v1 import common_pb2

if TYPE_CHECKING:  # the generic wrapper exists in the type stubs only
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

_KIND_VALUES = {
    JobKind.TRAINING: common_pb2.JOB_KIND_TRAINING,
    JobKind.BATCH_INFERENCE: common_pb2.JOB_KIND_BATCH_INFERENCE,
    JobKind.QUANTIZATION: common_pb2.JOB_KIND_QUANTIZATION,
    JobKind.REALTIME: common_pb2.JOB_KIND_REALTIME,
    JobKind.TRIAL: common_pb2.JOB_KIND_TRIAL,
}
_KIND_NAMES = {value: kind for kind, value in _KIND_VALUES.items()}
_RESTART_VALUES = {"never": common_pb2.RESTART_POLICY_NEVER, "on-failure": common_pb2.RESTART_POLICY_ON_FAILURE}
_RESTART_NAMES = {common_pb2.RESTART_POLICY_ON_FAILURE: "on-failure"}  # else "never"
_CONDITION_VALUES = {
    "succeeded": common_pb2.DEPENDENCY_CONDITION_SUCCEEDED,  # sbatch --dependency=afterok
    "finished": common_pb2.DEPENDENCY_CONDITION_FINISHED,  # afterany
    "failed": common_pb2.DEPENDENCY_CONDITION_FAILED,  # afternotok (FAILED or CANCELLED)
}
_CONDITION_NAMES = {value: name for name, value in _CONDITION_VALUES.items()}  # else "succeeded"


def enum_name(enum: _EnumTypeWrapper[Any], value: int, prefix: str, *, lower: bool = False) -> str:
    """The name of `value` in `enum` without `prefix` (lower-cased with `lower`); "" for 0
    (UNSPECIFIED) or a value newer than this SDK."""
    if not value:
        return ""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return ""
    name = name.removeprefix(prefix)
    return name.lower() if lower else name


def job_state(value: int) -> JobState:
    """The SDK's state of a wire JobState; ValueError for UNSPECIFIED or one newer than the SDK."""
    return JobState(common_pb2.JobState.Name(value).removeprefix("JOB_STATE_"))  # type: ignore[arg-type]


def job_state_value(state: JobState | str) -> common_pb2.JobState.ValueType:
    return common_pb2.JobState.Value("JOB_STATE_" + JobState.parse(state).value)


def job_kind(value: int) -> JobKind:
    """The SDK's kind of a wire JobKind; training (the server's default) for UNSPECIFIED."""
    return _KIND_NAMES.get(value, JobKind.TRAINING)  # type: ignore[call-overload]


def spec_to_proto(spec: JobSpec, *, base_dir: Path | None = None) -> common_pb2.JobSpec:
    """The wire message of a JobSpec; a relative workdir is resolved against `base_dir`
    (default: the current directory). InvalidArgumentError naming the field for what cannot
    be put on the wire at all (an unknown kind or restart policy, features that are not JSON)."""
    _check_wire_fields(spec)
    workdir = os.fspath(spec.workdir)
    if not os.path.isabs(workdir):
        workdir = str(((base_dir or Path.cwd()) / workdir).resolve())
    message = common_pb2.JobSpec(
        name=spec.name, tenant=spec.tenant, kind=_KIND_VALUES[JobKind(spec.kind)], priority=spec.priority,
        gpus=spec.gpus, command=[str(a) for a in spec.command], workdir=workdir,
        env={str(k): str(v) for k, v in spec.env.items()}, preemptible=spec.preemptible,
        restart=_RESTART_VALUES[spec.restart], max_retries=spec.max_retries, demand=list(spec.demand),
        max_swap=spec.max_swap, accepts_layout_changes=spec.accepts_layout_changes, nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node, gpu_types=list(spec.gpu_types), same_switch=spec.same_switch,
        gpu_memory_mb=spec.gpu_memory_mb, memory="" if spec.memory is None else str(spec.memory),
    )
    if spec.nodes and spec.gpus_per_node and spec.gpus == 1:
        message.gpus = 0  # the default: the server sets nodes x gpus_per_node
    _add_dependencies(message, spec)
    if spec.duration is not None:
        message.duration_seconds = spec.duration.total_seconds()
    if spec.cpus is not None:
        message.cpus = float(spec.cpus)
    if spec.time_limit is not None:
        message.time_limit_seconds = spec.time_limit.total_seconds()
    if spec.features:
        message.features.CopyFrom(_features(spec))
    return message


def _check_wire_fields(spec: JobSpec) -> None:
    if spec.kind not in _KIND_VALUES:
        raise InvalidArgumentError(f"kind: unknown kind {spec.kind!r}; one of {', '.join(JobKind)}", field="kind")
    if spec.restart not in _RESTART_VALUES:
        raise InvalidArgumentError(f"restart: one of {', '.join(_RESTART_VALUES)} (got {spec.restart!r})", field="restart")
    if isinstance(spec.command, str):
        raise InvalidArgumentError("command: must be a list of strings, not one string", field="command")


def _add_dependencies(message: common_pb2.JobSpec, spec: JobSpec) -> None:
    for i, dep in enumerate(spec.depends_on):
        dep = Dependency(dep) if isinstance(dep, str) else dep
        if dep.when not in _CONDITION_VALUES:
            raise InvalidArgumentError(f"depends_on[{i}].when: one of {', '.join(_CONDITION_VALUES)} (got {dep.when!r})",
                                       field=f"depends_on[{i}].when")
        message.depends_on.add(job=dep.job, when=_CONDITION_VALUES[dep.when])


def _features(spec: JobSpec) -> struct_pb2.Struct:
    features = struct_pb2.Struct()
    try:
        features.update(dict(spec.features))
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"features: must hold JSON values ({exc})", field="features") from exc
    return features


def spec_from_proto(message: common_pb2.JobSpec) -> JobSpec:
    """The JobSpec of a wire message (a job's spec as the api answers it)."""
    return JobSpec(
        command=tuple(message.command), name=message.name, tenant=message.tenant, kind=job_kind(message.kind),
        priority=message.priority, gpus=message.gpus, workdir=message.workdir, env=dict(message.env),
        duration=timedelta(seconds=message.duration_seconds) if message.HasField("duration_seconds") else None,
        preemptible=message.preemptible, restart=_RESTART_NAMES.get(message.restart, "never"),
        max_retries=message.max_retries, features=json_format.MessageToDict(message.features),
        demand=tuple(message.demand), max_swap=message.max_swap, accepts_layout_changes=message.accepts_layout_changes,
        nodes=message.nodes, gpus_per_node=message.gpus_per_node, gpu_types=tuple(message.gpu_types),
        same_switch=message.same_switch, gpu_memory_mb=message.gpu_memory_mb,
        cpus=message.cpus if message.HasField("cpus") else None, memory=message.memory or None,
        time_limit=timedelta(seconds=message.time_limit_seconds) if message.HasField("time_limit_seconds") else None,
        depends_on=tuple(Dependency(d.job, _CONDITION_NAMES.get(d.when, "succeeded")) for d in message.depends_on),
    )


def states_values(states: Sequence[JobState | str]) -> list[common_pb2.JobState.ValueType]:
    return [job_state_value(s) for s in states]


__all__ = ["enum_name", "job_kind", "job_state", "job_state_value", "spec_from_proto", "spec_to_proto", "states_values"]
