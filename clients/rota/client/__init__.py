"""Rota's Python SDK. `Client.from_home()` (the folder `rota up` writes, default $ROTA_HOME),
`Client.from_env()` (the CLI's variables) or `Client.connect(target, token=..., timeout=...)`
is the entry point.

The job files' API loads at import, the client (and grpc) on first use of `Client`; the results of the other services' calls (checkpoints,
health, forecasts, the ledger, plans) load on first use (`rota.client.Verdict` imports
`rota.client.detector` then), so a script's `rota submit` pays for the job API alone."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rota.client.arrays import JobArray
from rota.client.enums import JobKind, JobState
from rota.client.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RotaError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from rota.client.home import ClusterHome, NoClusterError
from rota.client.jobfile import (
    job_spec_from_mapping,
    load_job_file,
    load_job_spec,
    parse_duration,
)
from rota.client.jobspec import Dependency, JobSpec
from rota.client.tls import TLS

if TYPE_CHECKING:
    from rota.client.checkpoint import (
        CheckpointImage,
        CheckpointOperation,
        CheckpointResult,
        JobImages,
        MigrateResult,
        PauseResult,
        ResumeResult,
    )
    from rota.client.client import Client, Gpu, Job, JobEvent, Node, StateChange, Tenant
    from rota.client.detector import DeviceHealth, DrainResult, ReplanResult, Verdict
    from rota.client.kv_window import AdmissionEndpoint
    from rota.client.ledger import JobFairness, Standings, TenantFairness, UsageEntry
    from rota.client.plan import CurrentPlan, Explanation, PlannedJob, ScenarioPlan, WhatIf
    from rota.client.users import User

_LAZY = {
    "AdmissionEndpoint": "rota.client.kv_window",
    "User": "rota.client.users",
    # The client itself (it brings grpc): `rota submit` over HTTP reads job files with
    # this package and never dials gRPC (rota.cli.http_submit).
    **dict.fromkeys(("Client", "Gpu", "Job", "JobEvent", "Node", "StateChange", "Tenant"), "rota.client.client"),
    **dict.fromkeys(("CheckpointImage", "CheckpointOperation", "CheckpointResult", "JobImages", "MigrateResult",
                     "PauseResult", "ResumeResult"), "rota.client.checkpoint"),
    **dict.fromkeys(("DeviceHealth", "DrainResult", "ReplanResult", "Verdict"), "rota.client.detector"),
    **dict.fromkeys(("JobFairness", "Standings", "TenantFairness", "UsageEntry"), "rota.client.ledger"),
    **dict.fromkeys(("CurrentPlan", "Explanation", "PlannedJob", "ScenarioPlan", "WhatIf"), "rota.client.plan"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rota.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next lookup is a plain attribute
    return value

__all__ = [
    "AdmissionEndpoint", "Client", "TLS", "CurrentPlan", "PlannedJob", "ScenarioPlan", "WhatIf", "Explanation", "Gpu", "Job", "JobEvent", "Node", "StateChange", "Tenant",
    "RotaError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "UnauthenticatedError", "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "UnimplementedError", "load_job_file", "parse_duration",
    "JobSpec", "JobState", "JobKind", "Dependency", "JobArray", "load_job_spec", "job_spec_from_mapping", "ClusterHome", "NoClusterError",
    "JobFairness", "Standings", "TenantFairness", "UsageEntry",
    "CheckpointImage", "CheckpointOperation", "CheckpointResult", "JobImages", "MigrateResult", "PauseResult",
    "ResumeResult",
    "DeviceHealth", "DrainResult", "ReplanResult", "Verdict", "User",
]
