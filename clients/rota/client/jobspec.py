"""The SDK's job specification: what a job file holds, as a frozen dataclass.

`Client.submit(spec=JobSpec(...))` (also `what_if`, `forecast`) converts it to the wire
message; the server validates the values (power-of-two GPUs, priority range, names, ...)
and answers InvalidArgumentError naming the field. Only what cannot be put on the wire at
all (an unknown kind or restart policy, features that are not JSON) fails here, with the
same error type.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

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
CONDITIONS = {
    "succeeded": common_pb2.DEPENDENCY_CONDITION_SUCCEEDED,  # sbatch --dependency=afterok
    "finished": common_pb2.DEPENDENCY_CONDITION_FINISHED,  # afterany
    "failed": common_pb2.DEPENDENCY_CONDITION_FAILED,  # afternotok (FAILED or CANCELLED)
}


@dataclass(frozen=True)
class Dependency:
    """A parent (a job's or an array's id) and what the dependent waits for."""

    job: str
    when: str = "succeeded"  # succeeded | finished | failed


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A job to submit; the fields and defaults of a job file (README "Job files").

    `workdir` relative to the current directory when the spec is sent (a job file's
    relative workdir is resolved against its base directory when it is read); `duration`
    is the declared estimate (None: none); `max_retries` 0 is the server's default (3)."""

    command: Sequence[str]
    name: str = ""  # empty: the server names the job after its script
    tenant: str = ""  # required with the admin token; a tenant's token decides it otherwise
    kind: str = "training"  # training | batch_inference | quantization | realtime | trial
    priority: int = 5  # 1 (lowest) .. 10
    gpus: int = 1  # a power of two; above the largest node, a gang of whole nodes
    workdir: str | os.PathLike[str] = "."
    env: Mapping[str, str] = field(default_factory=dict)
    duration: timedelta | None = None
    preemptible: bool = False
    restart: str = "never"  # never | on-failure
    max_retries: int = 0
    features: Mapping[str, Any] = field(default_factory=dict)  # forecaster features (params, tokens, ...)
    demand: Sequence[int] = ()  # realtime: GPUs per plan step
    max_swap: int = 0  # realtime: GPUs added plus removed per step (0: no cap)
    accepts_layout_changes: bool = False
    # A gang: `nodes` whole nodes (a power of two) x `gpus_per_node` ranks each; leave
    # `gpus` at 1 (or 0) and the server sets it to nodes x gpus_per_node.
    nodes: int = 0
    gpus_per_node: int = 0
    gpu_types: Sequence[str] = ()  # the GPU types it may run on (empty: any)
    same_switch: bool = False  # a gang whose nodes must hang off one switch
    gpu_memory_mb: int = 0  # MiB it needs on each GPU (0: not said); a trial in bubbles needs that free
    # Waits until each holds; fails once one cannot (a plain id: `succeeded`).
    depends_on: Sequence[Dependency | str] = ()

    def to_proto(self, *, base_dir: Path | None = None) -> common_pb2.JobSpec:
        """The wire message; a relative workdir is resolved against `base_dir` (default: the
        current directory)."""
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"kind: unknown kind {self.kind!r}; one of {', '.join(KINDS)}", field="kind")
        if self.restart not in RESTARTS:
            raise InvalidArgumentError(f"restart: one of {', '.join(RESTARTS)} (got {self.restart!r})", field="restart")
        if isinstance(self.command, str):
            raise InvalidArgumentError("command: must be a list of strings, not one string", field="command")
        workdir = os.fspath(self.workdir)
        if not os.path.isabs(workdir):
            workdir = str(((base_dir or Path.cwd()) / workdir).resolve())
        spec = common_pb2.JobSpec(
            name=self.name, tenant=self.tenant, kind=KINDS[self.kind], priority=self.priority, gpus=self.gpus,
            command=[str(a) for a in self.command], workdir=workdir, env={str(k): str(v) for k, v in self.env.items()},
            preemptible=self.preemptible, restart=RESTARTS[self.restart], max_retries=self.max_retries,
            demand=list(self.demand), max_swap=self.max_swap, accepts_layout_changes=self.accepts_layout_changes,
            nodes=self.nodes, gpus_per_node=self.gpus_per_node, gpu_types=list(self.gpu_types),
            same_switch=self.same_switch, gpu_memory_mb=self.gpu_memory_mb,
        )
        if self.nodes and self.gpus_per_node and self.gpus == 1:
            spec.gpus = 0  # the default: the server sets nodes x gpus_per_node
        for i, dep in enumerate(self.depends_on):
            dep = Dependency(dep) if isinstance(dep, str) else dep
            if dep.when not in CONDITIONS:
                raise InvalidArgumentError(f"depends_on[{i}].when: one of {', '.join(CONDITIONS)} (got {dep.when!r})",
                                           field=f"depends_on[{i}].when")
            spec.depends_on.add(job=dep.job, when=CONDITIONS[dep.when])
        if self.duration is not None:
            spec.duration_seconds = self.duration.total_seconds()
        if self.features:
            features = struct_pb2.Struct()
            try:
                features.update(dict(self.features))
            except (ValueError, TypeError) as exc:
                raise InvalidArgumentError(f"features: must hold JSON values ({exc})", field="features") from exc
            spec.features.CopyFrom(features)
        return spec


def spec_proto(spec: JobSpec | common_pb2.JobSpec) -> common_pb2.JobSpec:
    """What `submit`, `what_if` and `forecast` send: a JobSpec converted, a proto as it is."""
    return spec.to_proto() if isinstance(spec, JobSpec) else spec


__all__ = ["CONDITIONS", "Dependency", "JobSpec", "KINDS", "RESTARTS", "spec_proto"]
