"""Rota's Python SDK. `Client.from_home()` (the folder `rota up` writes, default $ROTA_HOME),
`Client.from_env()` (the CLI's variables) or `Client.connect(target, token=..., timeout=...)`
is the entry point."""

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
    spec_from_mapping,
)
from rota.client.jobspec import JobSpec
from rota.client.ledger import JobFairness, Standings, TenantFairness, UsageEntry
from rota.client.plan import CurrentPlan, Explanation, PlannedJob, ScenarioPlan, WhatIf
from rota.client.tls import TLS

__all__ = [
    "Client", "TLS", "CurrentPlan", "PlannedJob", "ScenarioPlan", "WhatIf", "Explanation", "Gpu", "Job", "JobEvent", "Node", "StateChange", "Tenant",
    "RotaError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "UnauthenticatedError", "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "UnimplementedError", "load_job_file", "parse_duration", "spec_from_mapping",
    "JobSpec", "load_job_spec", "job_spec_from_mapping", "ClusterHome", "NoClusterError",
    "JobFairness", "Standings", "TenantFairness", "UsageEntry",
    "CheckpointImage", "CheckpointOperation", "CheckpointResult", "JobImages", "MigrateResult", "PauseResult",
    "ResumeResult",
    "DeviceHealth", "DrainResult", "ReplanResult", "Verdict",
]
