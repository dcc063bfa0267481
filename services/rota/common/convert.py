"""Proto <-> domain conversions for the api (and the SDK's server-side twin)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from rota.common.models import TenantRow
from rota.core.errors import InvalidArgument
from rota.core.jobspec import JobSpecData
from rota.v1 import common_pb2

if TYPE_CHECKING:  # the generic wrapper exists in the type stubs only
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

_V = TypeVar("_V", bound=int)

KIND_NAMES = {
    common_pb2.JOB_KIND_TRAINING: "training",
    common_pb2.JOB_KIND_BATCH_INFERENCE: "batch_inference",
    common_pb2.JOB_KIND_QUANTIZATION: "quantization",
    common_pb2.JOB_KIND_REALTIME: "realtime",
    common_pb2.JOB_KIND_TRIAL: "trial",
}
KIND_VALUES = {name: value for value, name in KIND_NAMES.items()}
RESTART_NAMES = {
    common_pb2.RESTART_POLICY_UNSPECIFIED: "never",
    common_pb2.RESTART_POLICY_NEVER: "never",
    common_pb2.RESTART_POLICY_ON_FAILURE: "on-failure",
}
RESTART_VALUES = {"never": common_pb2.RESTART_POLICY_NEVER, "on-failure": common_pb2.RESTART_POLICY_ON_FAILURE}
CONDITION_NAMES = {
    common_pb2.DEPENDENCY_CONDITION_UNSPECIFIED: "succeeded",
    common_pb2.DEPENDENCY_CONDITION_SUCCEEDED: "succeeded",
    common_pb2.DEPENDENCY_CONDITION_FINISHED: "finished",
    common_pb2.DEPENDENCY_CONDITION_FAILED: "failed",
}
CONDITION_VALUES = {name: value for value, name in CONDITION_NAMES.items() if value}


def state_value(state: str) -> common_pb2.JobState.ValueType:
    return common_pb2.JobState.Value("JOB_STATE_" + state)


def state_name(value: int, field: str = "state") -> str:
    """The state's name; InvalidArgument naming `field` for a number no version defines."""
    try:
        return common_pb2.JobState.Name(value).removeprefix("JOB_STATE_")  # type: ignore[arg-type]
    except ValueError:
        raise InvalidArgument(field, f"unknown job state {value}") from None


def health_value(health: str) -> common_pb2.NodeHealth.ValueType:
    return common_pb2.NodeHealth.Value("NODE_HEALTH_" + health)


def enum_value(enum: _EnumTypeWrapper[_V], prefix: str, name: str) -> _V:
    """The wire enum of a state or kind the tables hold as text: "writing" ->
    IMAGE_STATE_WRITING, "BAD" -> DEVICE_STATE_BAD. A name the enum lacks reads
    <PREFIX>UNSPECIFIED."""
    try:
        return enum.Value(prefix + name.upper())
    except ValueError:
        return enum.Value(prefix + "UNSPECIFIED")


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def struct(values: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def spec_from_proto(spec: common_pb2.JobSpec) -> JobSpecData:
    return JobSpecData(
        name=spec.name,
        tenant=spec.tenant,
        kind=KIND_NAMES.get(spec.kind, f"<{spec.kind}>") if spec.kind else "",
        priority=spec.priority,
        gpus=spec.gpus,
        command=list(spec.command),
        workdir=spec.workdir,
        env=dict(spec.env),
        duration_seconds=spec.duration_seconds if spec.HasField("duration_seconds") else None,
        preemptible=spec.preemptible,
        restart=RESTART_NAMES.get(spec.restart, f"<{spec.restart}>"),
        max_retries=spec.max_retries,
        features=json_format.MessageToDict(spec.features) if spec.HasField("features") else {},
        demand=list(spec.demand),
        max_swap=spec.max_swap,
        accepts_layout_changes=spec.accepts_layout_changes,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        gpu_types=list(spec.gpu_types),
        same_switch=spec.same_switch,
        gpu_memory_mb=spec.gpu_memory_mb,
        cpus=spec.cpus if spec.HasField("cpus") else None,
        memory=spec.memory,
        time_limit_seconds=spec.time_limit_seconds if spec.HasField("time_limit_seconds") else None,
        # An unknown condition number reads as a name validation refuses, naming the field.
        depends_on=[{"job": d.job, "when": CONDITION_NAMES.get(d.when, f"<{d.when}>")} for d in spec.depends_on],
    )


def spec_to_proto(spec: JobSpecData) -> common_pb2.JobSpec:
    message = common_pb2.JobSpec(
        name=spec.name,
        tenant=spec.tenant,
        kind=KIND_VALUES.get(spec.kind, common_pb2.JOB_KIND_UNSPECIFIED),
        priority=spec.priority,
        gpus=spec.gpus,
        command=spec.command,
        workdir=spec.workdir,
        env=spec.env,
        preemptible=spec.preemptible,
        restart=RESTART_VALUES.get(spec.restart, common_pb2.RESTART_POLICY_UNSPECIFIED),
        max_retries=spec.max_retries,
        demand=spec.demand,
        max_swap=spec.max_swap,
        accepts_layout_changes=spec.accepts_layout_changes,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        gpu_types=spec.gpu_types,
        same_switch=spec.same_switch,
        gpu_memory_mb=spec.gpu_memory_mb,
        memory=spec.memory,
        depends_on=[common_pb2.Dependency(job=d["job"], when=CONDITION_VALUES.get(d["when"], common_pb2.DEPENDENCY_CONDITION_UNSPECIFIED)) for d in spec.depends_on],
    )
    if spec.duration_seconds is not None:
        message.duration_seconds = spec.duration_seconds
    if spec.cpus is not None:
        message.cpus = spec.cpus
    if spec.time_limit_seconds is not None:
        message.time_limit_seconds = spec.time_limit_seconds
    if spec.features:
        message.features.CopyFrom(struct(spec.features))
    return message


def tenant_to_proto(tenant: TenantRow) -> common_pb2.Tenant:
    return common_pb2.Tenant(name=tenant.name, share=tenant.share, created_at=timestamp(tenant.created_at),
                             token_expires_at=timestamp(tenant.token_expires_at))


def progress_from_json(raw: str) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
