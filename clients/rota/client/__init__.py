"""Rota's Python SDK. `Client.connect(target, token=..., timeout=...)` is the entry point."""

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
from rota.client.jobfile import load_job_file, parse_duration, spec_from_mapping
from rota.client.ledger import JobFairness, Standings, TenantFairness, UsageEntry
from rota.client.plan import CurrentPlan, Explanation, PlannedJob, ScenarioPlan, WhatIf
from rota.client.tls import TLS

__all__ = [
    "Client", "TLS", "CurrentPlan", "PlannedJob", "ScenarioPlan", "WhatIf", "Explanation", "Gpu", "Job", "JobEvent", "Node", "StateChange", "Tenant",
    "RotaError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "UnauthenticatedError", "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "UnimplementedError", "load_job_file", "parse_duration", "spec_from_mapping",
    "JobFairness", "Standings", "TenantFairness", "UsageEntry",
    "CheckpointImage", "CheckpointOperation", "CheckpointResult", "JobImages", "MigrateResult", "PauseResult",
    "ResumeResult",
    "DeviceHealth", "DrainResult", "ReplanResult", "Verdict",
]
