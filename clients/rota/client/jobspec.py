"""The SDK's job specification: what a job file holds, as a frozen dataclass.

`Client.submit(spec=JobSpec(...))` (also `submit_array`, `what_if`, `forecast`) sends it
(converted by the private `rota.client._wire`); the server validates the values
(power-of-two GPUs, priority range, names, ...) and answers InvalidArgumentError naming the
field. Only what cannot be put on the wire at all (an unknown kind or restart policy,
features that are not JSON) fails in the client, with the same error type. `Job.spec` is
one too: the spec the job was submitted with, as the api answers it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rota.client.enums import JobKind

KINDS = tuple(k.value for k in JobKind)  # training | batch_inference | quantization | realtime | trial
RESTARTS = ("never", "on-failure")
# What a dependent waits for: succeeded (sbatch --dependency=afterok), finished (afterany),
# failed (afternotok: FAILED or CANCELLED).
CONDITIONS = ("succeeded", "finished", "failed")


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
    kind: JobKind | str = JobKind.TRAINING  # a JobKind or its name ("batch_inference")
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
    # Limits the node enforces in the job's own cgroup, and the plan reserves (None: none):
    # CPUs (2, 0.5), memory per node (a quantity such as "4Gi" or "256Mi", or bytes) and
    # the wall-clock limit of each run (past it the job is stopped and says so).
    cpus: float | None = None
    memory: str | int | None = None
    time_limit: timedelta | None = None


__all__ = ["CONDITIONS", "Dependency", "JobSpec", "KINDS", "RESTARTS"]
