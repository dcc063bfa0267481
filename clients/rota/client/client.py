"""The Python SDK: a typed, synchronous client of the api.

Every call has a deadline (the client's default timeout unless given); the channel
retries only UNAVAILABLE, with exponential backoff, through gRPC's service config; and
submissions always carry a request id, so a retried submission never creates two jobs.
"""

from __future__ import annotations

import codecs
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf import duration_pb2, json_format

from rota.client import _wire
from rota.client.arrays import JobArray, array_request
from rota.client.enums import FINISHED, JobKind, JobState
from rota.client.errors import NotFoundError, RotaError, from_rpc_error
from rota.client.home import ClusterHome, resolve_connection
from rota.client.jobspec import Dependency, JobSpec
from rota.client.tls import TLS
from rota.client.users import User
from rota.v1 import api_pb2, api_pb2_grpc, common_pb2

# The other services' messages and stubs are imported by the methods that call them: a
# script's `rota submit` loads the job API alone (SDK import: a third of its CPU before).
if TYPE_CHECKING:
    from rota.client.checkpoint import CheckpointResult, JobImages, MigrateResult, PauseResult, ResumeResult
    from rota.client.detector import DeviceHealth, DrainResult, ReplanResult, Verdict
    from rota.client.forecast import DemandForecast, Forecast, TrafficSample
    from rota.client.kv_window import AdmissionEndpoint
    from rota.client.ledger import JobFairness, Standings, UsageEntry
    from rota.client.plan import CurrentPlan, Explanation, ScenarioPlan, WhatIf
    from rota.v1 import allocator_pb2_grpc, ledger_pb2_grpc

T = TypeVar("T")

_RETRY_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": f"rota.v1.{name}"} for name in (
            "JobService", "TenantService", "ClusterService", "AllocatorService", "LedgerService",
            "ForecasterService", "CheckpointService", "DetectorService",
        )],
        "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.2s", "maxBackoff": "3s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
})


def _time(ts: Any) -> datetime | None:
    """A Timestamp as an aware UTC datetime; unset: None."""
    return ts.ToDatetime(tzinfo=UTC) if ts.seconds or ts.nanos else None


def iso_utc(t: datetime | None, timespec: str = "auto") -> str | None:
    """ISO 8601 in UTC with `Z`, as the plan's JSON writes its times (a naive `t` is UTC)."""
    if t is None:
        return None
    return (t.astimezone(UTC) if t.tzinfo else t).replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


def _duration(value: timedelta | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


def log_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Text lines from a byte stream cut anywhere: a line (or a UTF-8 character) split across
    chunks comes out whole, a final line without a newline still comes out. Lines carry no
    "\n" (nor the "\r" of a "\r\n"); bytes that are not UTF-8 read as U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.removesuffix("\r")


def _tenant(t: common_pb2.Tenant) -> Tenant:
    return Tenant(t.name, t.share, _time(t.token_expires_at), guaranteed=t.guaranteed,
                  limit=t.limit if t.HasField("limit") else None, gpu_limits=dict(t.gpu_limits), parent=t.parent,
                  in_use=t.in_use, borrowed=t.borrowed)


def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    # protobuf Struct holds every number as a double; a reported step 300 reads back as 300.
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in values.items()}


@dataclass(frozen=True)
class StateChange:
    from_state: JobState
    to_state: JobState
    reason: str
    at: datetime | None  # aware, UTC (as every time of a Job)


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    tenant: str
    kind: JobKind
    priority: int
    state: JobState
    reason: str
    node: str
    gpus: list[int]
    epoch: int
    attempts: int
    exit_code: int
    error: str
    progress: dict[str, Any]
    history: list[StateChange]
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    spec: JobSpec = field(repr=False)  # what it was submitted with
    # A gang: its nodes in node-rank order (nodes[0] == node; `gpus` on each); [] otherwise.
    nodes: list[str] = field(default_factory=list)
    # A realtime app: each node's replica GPUs, its home node first ({} otherwise).
    replicas: dict[str, list[int]] = field(default_factory=dict)
    # A task of a job array: the array's id ("" otherwise) and the task's index.
    array_id: str = ""
    array_index: int = 0
    # A trial running as a guest in this job's pipeline bubbles, on its GPUs ("" otherwise).
    guest_of: str = ""
    guests: list[str] = field(default_factory=list)  # trials in this job's bubbles now (GetJob)
    user: str = ""  # the user whose token submitted it ("" for a tenant's own token or the admin's)

    @staticmethod
    def _from_proto(job: common_pb2.Job) -> Job:
        return Job(
            id=job.id,
            name=job.spec.name,
            tenant=job.spec.tenant,
            kind=_wire.job_kind(job.spec.kind),
            priority=job.spec.priority,
            state=_wire.job_state(job.state),
            reason=job.reason,
            node=job.node,
            gpus=list(job.gpus),
            epoch=job.epoch,
            attempts=job.attempts,
            exit_code=job.exit_code,
            error=job.error,
            progress=_numbers(json_format.MessageToDict(job.progress)),
            history=[StateChange(_wire.job_state(h.from_state), _wire.job_state(h.to_state), h.reason, _time(h.at))
                     for h in job.history],
            created_at=_time(job.created_at),
            started_at=_time(job.started_at),
            finished_at=_time(job.finished_at),
            spec=_wire.spec_from_proto(job.spec),
            nodes=list(job.gang.nodes),
            replicas={r.node: list(r.gpus) for r in job.replicas},
            array_id=job.array_id,
            array_index=job.array_index,
            guest_of=job.guest_of,
            guests=list(job.guests),
            user=job.user,
        )

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "tenant": self.tenant, "user": self.user or None, "kind": self.kind, "priority": self.priority,
            "state": self.state, "reason": self.reason, "node": self.node, "nodes": self.nodes, "gpus": self.gpus,
            "replicas": self.replicas, "epoch": self.epoch,
            "attempts": self.attempts, "exit_code": self.exit_code, "error": self.error, "progress": self.progress,
            "history": [
                {"from": h.from_state, "to": h.to_state, "reason": h.reason, "at": iso_utc(h.at)}
                for h in self.history
            ],
            "created_at": iso_utc(self.created_at),
            "started_at": iso_utc(self.started_at),
            "finished_at": iso_utc(self.finished_at),
            "command": list(self.spec.command),
            # Its limits as asked (None: none): CPUs, memory per node as written, seconds.
            "cpus": self.spec.cpus, "memory": None if self.spec.memory is None else str(self.spec.memory),
            "time_limit": self.spec.time_limit.total_seconds() if self.spec.time_limit is not None else None,
            "array": self.array_id or None,
            "array_index": self.array_index if self.array_id else None,
            "guest_of": self.guest_of or None,
            "guests": self.guests,
            "depends_on": [{"job": d.job, "when": d.when}
                           for d in (Dependency(d) if isinstance(d, str) else d for d in self.spec.depends_on)],
        }


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    virtual: bool
    job_id: str
    type: str = ""  # "a100", what a job's gpu_types names; "" when the node declared none


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    health: str
    gpus: list[Gpu]
    last_heartbeat: datetime | None
    labels: dict[str, str] = field(default_factory=dict)  # its place in the network: switch, rack
    cpus: float = 0.0  # what jobs' `cpus` may reserve on it (0: not reported)
    memory_bytes: int = 0  # what jobs' `memory` may reserve on it (0: not reported)

    @property
    def switch(self) -> str:
        """The network switch the node hangs off (its `switch` label); "" when not declared."""
        return self.labels.get("switch", "")

    @property
    def gpu_types(self) -> list[str]:
        """The distinct types of its GPUs, sorted; untyped GPUs are left out."""
        return sorted({g.type for g in self.gpus if g.type})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "address": self.address, "health": self.health,
            "last_heartbeat": iso_utc(self.last_heartbeat),
            "labels": dict(self.labels), "cpus": self.cpus, "memory_bytes": self.memory_bytes,
            "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "type": g.type, "virtual": g.virtual,
                      "job": g.job_id or None}
                     for g in self.gpus],
        }


@dataclass(frozen=True)
class Tenant:
    name: str
    share: float
    token_expires_at: datetime | None = None  # UTC, naive; None: the token does not expire
    # Quotas (docs/tenants.md): GPUs guaranteed, the most its subtree holds (None: no cap),
    # the most of each GPU type, the tenant above it ("" for a root).
    guaranteed: int = 0
    limit: int | None = None
    gpu_limits: dict[str, int] = field(default_factory=dict)
    parent: str = ""
    in_use: int = 0  # GPUs its subtree holds now (list_tenants)
    borrowed: int = 0  # of those, beyond its guarantee


@dataclass(frozen=True)
class JobEvent:
    event: str
    job: Job


class Client:
    """Use `Client.from_home()` for a cluster `rota up` started (its folder: the argument or
    $ROTA_HOME), `Client.from_env()` for the variables the CLI reads, or
    `Client.connect(target, token=..., timeout=timedelta(seconds=30))`; against a cluster with
    mutual TLS add `tls=TLS(ca=..., cert=..., key=...)` (then a tenant's client certificate may
    stand in for its token: `token=""`)."""

    def __init__(self, channel: grpc.Channel, *, token: str, timeout: timedelta) -> None:
        self._channel = channel
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout.total_seconds()
        self._jobs = api_pb2_grpc.JobServiceStub(channel)
        self._tenants = api_pb2_grpc.TenantServiceStub(channel)
        self._cluster = api_pb2_grpc.ClusterServiceStub(channel)

    @classmethod
    def connect(
        cls, target: str, *, token: str, timeout: timedelta = timedelta(seconds=30), tls: TLS | None = None
    ) -> Client:
        options = [("grpc.service_config", _RETRY_CONFIG), ("grpc.enable_retries", 1)]
        if tls is None:
            return cls(grpc.insecure_channel(target, options=options), token=token, timeout=timeout)
        return cls(grpc.secure_channel(target, tls.credentials(), options=options), token=token, timeout=timeout)

    @classmethod
    def from_home(
        cls, home: str | os.PathLike[str] | None = None, *, token: str | None = None,
        timeout: timedelta = timedelta(seconds=30),
    ) -> Client:
        """The cluster `rota up --home DIR` runs: DIR is `home`, else $ROTA_HOME. Dials the
        endpoint it recorded (with its client certificate under `--tls`) with `token`, by
        default the cluster's admin token. NoClusterError (a ValueError) naming ROTA_HOME
        when neither is set or the folder holds no running cluster's endpoint."""
        found = ClusterHome.read(home)
        return cls.connect(found.endpoint, token=token if token is not None else found.admin_token(),
                           timeout=timeout, tls=found.tls)

    @classmethod
    def from_env(
        cls, *, endpoint: str | None = None, token: str | None = None, home: str | os.PathLike[str] | None = None,
        timeout: timedelta = timedelta(seconds=30), environ: Mapping[str, str] | None = None,
    ) -> Client:
        """As the `rota` command connects: endpoint from ROTA_ENDPOINT, token from ROTA_TOKEN,
        each else from the cluster folder ROTA_HOME (its endpoint, its admin token); mutual
        TLS from ROTA_TLS_CA, ROTA_TLS_CERT and ROTA_TLS_KEY (all three), else the
        certificate `rota up --tls` recorded there. An argument given wins over its variable.
        NoClusterError when no endpoint, or no token without TLS, is found."""
        found = resolve_connection(endpoint=endpoint, token=token, home=home, environ=environ)
        return cls.connect(found.endpoint, token=found.token, timeout=timeout, tls=found.tls)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., T], request: Any, timeout: timedelta | None = None) -> T:
        seconds = timeout.total_seconds() if timeout is not None else self._timeout
        try:
            return method(request, timeout=seconds, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # Jobs.
    def submit(self, *, spec: JobSpec, request_id: str | None = None) -> Job:
        """Submits a job; safe to retry with the same request_id (one is made if not given)."""
        request = api_pb2.SubmitJobRequest(spec=_wire.spec_to_proto(spec), request_id=request_id or str(uuid.uuid4()))
        return Job._from_proto(self._call(self._jobs.SubmitJob, request).job)

    def get_job(self, job_id: str) -> Job:
        return Job._from_proto(self._call(self._jobs.GetJob, api_pb2.GetJobRequest(id=job_id)).job)

    def admission(self, job_id: str, *, timeout: timedelta = timedelta(seconds=5)) -> AdmissionEndpoint:
        """The admission controller of a running agentic batch (its progress's `admission_url`),
        for agents outside Rota: `admit(agent, tokens=N)` at each step boundary, `release(agent)` when
        done (rota.client.kv_window). FailedPreconditionError when the job has none."""
        from rota.client.kv_window import endpoint_of

        return endpoint_of(job_id, self.get_job(job_id).progress, timeout)

    def get_array(self, array_id: str) -> JobArray:
        """A job array: its tasks' ids in index order and how many are in each state."""
        reply = self._call(self._jobs.GetJobArray, api_pb2.GetJobArrayRequest(id=array_id))
        return JobArray._from_proto(reply.array)

    def submit_array(
        self, *, spec: JobSpec, indices: range | Sequence[int] | str,
        max_running: int | None = None, request_id: str | None = None, timeout: timedelta | None = None,
    ) -> JobArray:
        """One job per index (`range(100)`, `[1, 3, 5]`, or the text "0-99%4"), in one call and
        one commit; at most `max_running` tasks SCHEDULED or RUNNING at once (None: no cap).
        Safe to retry with the same request_id. The array's `job_ids` are in index order."""
        request = array_request(spec, indices, max_running, request_id)
        return JobArray._from_proto(self._call(self._jobs.SubmitJobArray, request, timeout).array)

    def cancel_array(self, array_id: str, *, reason: str = "") -> JobArray:
        """Cancels every unfinished task of the array (`cancel` does too, answering an empty Job)."""
        found = self.cancel_job_or_array(array_id, reason=reason)
        if not isinstance(found, JobArray):
            raise NotFoundError(f"{array_id} is a job, not an array (the job is cancelled)")
        return found

    def cancel_job_or_array(self, id: str, *, reason: str = "") -> Job | JobArray:
        """`rota cancel ID`: a job, or every unfinished task of an array; what it cancelled."""
        reply = self._call(self._jobs.CancelJob, api_pb2.CancelJobRequest(id=id, reason=reason))
        return JobArray._from_proto(reply.array) if reply.HasField("array") else Job._from_proto(reply.job)

    def list_jobs_and_arrays(
        self, *, tenant: str = "", states: Sequence[JobState | str] = (), limit: int = 0, mine: bool = False,
    ) -> tuple[list[Job], list[JobArray]]:
        """As `list_jobs`, with the arrays of the listed tasks, every task of each counted by state."""
        values = _wire.states_values(states or ())
        reply = self._call(self._jobs.ListJobs, api_pb2.ListJobsRequest(tenant=tenant, states=values, limit=limit,
                                                                         mine=mine))
        return [Job._from_proto(j) for j in reply.jobs], [JobArray._from_proto(a) for a in reply.arrays]

    def list_jobs(self, *, tenant: str = "", states: Sequence[JobState | str] = (), limit: int = 0,
                  mine: bool = False) -> list[Job]:
        """Jobs the caller may see, newest first; `states` (JobState or its name, any case)
        filters; ValueError naming the states for a name that is none. `mine`: only those
        this user's token submitted (a user's token only)."""
        values = _wire.states_values(states or ())
        reply = self._call(self._jobs.ListJobs, api_pb2.ListJobsRequest(tenant=tenant, states=values, limit=limit,
                                                                         mine=mine))
        return [Job._from_proto(j) for j in reply.jobs]

    def cancel(self, job_id: str, *, reason: str = "") -> Job:
        return Job._from_proto(self._call(self._jobs.CancelJob, api_pb2.CancelJobRequest(id=job_id, reason=reason)).job)

    def watch(self, job_id: str, *, timeout: timedelta = timedelta(hours=24)) -> Iterator[JobEvent]:
        """Events of one job until it finishes (or the timeout passes)."""
        stream = self._jobs.WatchJob(
            api_pb2.WatchJobRequest(id=job_id), timeout=timeout.total_seconds(), metadata=self._metadata
        )
        try:
            for reply in stream:
                yield JobEvent(reply.event, Job._from_proto(reply.job))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def logs(self, job_id: str, *, follow: bool = False, timeout: timedelta = timedelta(hours=24)) -> Iterator[str]:
        """The job's output as text lines (no trailing newline); with `follow`, until the job ends."""
        return log_lines(self.log_chunks(job_id, follow=follow, timeout=timeout))

    def log_chunks(self, job_id: str, *, follow: bool = False, timeout: timedelta = timedelta(hours=24)) -> Iterator[bytes]:
        """The job's output as the raw byte chunks the agent sends (cut anywhere, even inside
        a line or a character): for passing it through unchanged, as `rota logs` does."""
        stream = self._jobs.StreamLogs(
            api_pb2.StreamLogsRequest(id=job_id, follow=follow), timeout=timeout.total_seconds(), metadata=self._metadata
        )
        try:
            for reply in stream:
                yield reply.data
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def wait(self, job_id: str, *, timeout: timedelta = timedelta(hours=24)) -> Job:
        """Blocks until the job finishes; returns it."""
        for _event in self.watch(job_id, timeout=timeout):
            pass
        return self.get_job(job_id)

    # Plans.
    @property
    def _allocator(self) -> allocator_pb2_grpc.AllocatorServiceStub:
        # The api forwards the other services' RPCs: one endpoint, one token, one channel.
        from rota.v1 import allocator_pb2_grpc

        return allocator_pb2_grpc.AllocatorServiceStub(self._channel)

    def explain(self, job_id: str) -> Explanation:
        """Why the job waits (e.g. "planned at step 3, after ft-1 ends") or where it runs, and
        the duration it was planned on (forecast or declared) beside how long it ran."""
        from rota.client.plan import Explanation
        from rota.v1 import allocator_pb2

        return Explanation._from_proto(self._call(self._allocator.Explain, allocator_pb2.ExplainRequest(job_id=job_id)))

    def current_plan(self) -> CurrentPlan:
        """The live cluster's latest committed plan step. NotFoundError before the first plan."""
        from rota.client.plan import CurrentPlan
        from rota.v1 import allocator_pb2

        return CurrentPlan._from_proto(self._call(self._allocator.CurrentPlan, allocator_pb2.CurrentPlanRequest()))

    def what_if(self, *, spec: JobSpec) -> WhatIf:
        """When the job would start if submitted now; INVALID_ARGUMENT for a bad spec, as submit."""
        from rota.client.plan import WhatIf
        from rota.v1 import allocator_pb2

        reply = self._call(self._allocator.WhatIf, allocator_pb2.WhatIfRequest(spec=_wire.spec_to_proto(spec)))
        return WhatIf(reply.start_step, reply.expected_start_seconds, reply.reason)

    def plan_scenario(
        self, *, scenario: dict[str, Any], policy: str = "fast", time_limit: timedelta = timedelta(seconds=2)
    ) -> ScenarioPlan:
        """Plans a docs/design.md §3 scenario with a policy (fifo, fast, full) without touching the cluster."""
        from rota.client.plan import ScenarioPlan
        from rota.v1 import allocator_pb2

        request = allocator_pb2.PlanRequest(
            scenario_json=json.dumps(scenario), policy=policy, time_limit_seconds=time_limit.total_seconds()
        )
        return ScenarioPlan._from_proto(self._call(self._allocator.Plan, request, timeout=time_limit + timedelta(seconds=30)))

    # Checkpoints.
    def checkpoint(self, job_id: str, *, timeout: timedelta | None = None, operation_id: str | None = None) -> CheckpointResult:
        """Copies the running job's state into a new image (its ranks have `timeout` to reach a
        safe point) and waits until the image is written."""
        from rota.client.checkpoint import CheckpointResult
        from rota.client.checkpoint import stub as checkpoint_stub
        from rota.v1 import checkpoint_pb2

        seconds = timeout.total_seconds() if timeout else 0.0
        request = checkpoint_pb2.CheckpointRequest(job_id=job_id, operation_id=operation_id or str(uuid.uuid4()),
                                                   timeout_seconds=seconds)
        reply = self._call(checkpoint_stub(self._channel).Checkpoint, request, self._op_deadline(seconds, 0))
        return CheckpointResult._from_proto(reply)

    def pause(self, job_id: str, *, timeout: timedelta | None = None, operation_id: str | None = None) -> PauseResult:
        """Checkpoints the job and stops it: PAUSED, holding no GPU, once this returns."""
        from rota.client.checkpoint import PauseResult
        from rota.client.checkpoint import stub as checkpoint_stub
        from rota.v1 import checkpoint_pb2

        seconds = timeout.total_seconds() if timeout else 0.0
        request = checkpoint_pb2.PauseRequest(job_id=job_id, operation_id=operation_id or str(uuid.uuid4()),
                                              timeout_seconds=seconds)
        return PauseResult._from_proto(self._call(checkpoint_stub(self._channel).Pause, request, self._op_deadline(seconds, 0)))

    def resume(self, job_id: str, *, node: str = "", wait: timedelta = timedelta(0),
               operation_id: str | None = None) -> ResumeResult:
        """A paused job back in the queue with its last image; `node` is a preference. Waits up
        to `wait` for the allocator to place it."""
        from rota.client.checkpoint import ResumeResult
        from rota.client.checkpoint import stub as checkpoint_stub
        from rota.v1 import checkpoint_pb2

        request = checkpoint_pb2.ResumeRequest(job_id=job_id, operation_id=operation_id or str(uuid.uuid4()), node=node,
                                               wait_seconds=wait.total_seconds())
        reply = self._call(checkpoint_stub(self._channel).Resume, request, self._op_deadline(0, wait.total_seconds()))
        return ResumeResult._from_proto(reply)

    def migrate(self, job_id: str, *, node: str = "", timeout: timedelta | None = None,
                wait: timedelta = timedelta(seconds=60), operation_id: str | None = None) -> MigrateResult:
        """Pause, wait for the image, resume (preferring `node`); waits up to `wait` for the placement."""
        from rota.client.checkpoint import MigrateResult
        from rota.client.checkpoint import stub as checkpoint_stub
        from rota.v1 import checkpoint_pb2

        seconds = timeout.total_seconds() if timeout else 0.0
        request = checkpoint_pb2.MigrateRequest(job_id=job_id, operation_id=operation_id or str(uuid.uuid4()),
                                                target_node=node, timeout_seconds=seconds, wait_seconds=wait.total_seconds())
        reply = self._call(checkpoint_stub(self._channel).Migrate, request, self._op_deadline(seconds, wait.total_seconds()))
        return MigrateResult._from_proto(reply)

    def checkpoints(self, job_id: str) -> JobImages:
        """The job's images (size, what each added to the store, dedup, durations) and operations."""
        from rota.client.checkpoint import JobImages
        from rota.client.checkpoint import stub as checkpoint_stub
        from rota.v1 import checkpoint_pb2

        reply = self._call(checkpoint_stub(self._channel).ListImages, checkpoint_pb2.ListImagesRequest(job_id=job_id))
        return JobImages._from_proto(job_id, reply)

    def _op_deadline(self, timeout_s: float, wait_s: float) -> timedelta:
        # The ranks' bounded wait (the coordinator's default when 0), then any placement wait.
        from rota.client.checkpoint import RPC_MARGIN_S

        return timedelta(seconds=self._timeout + max(timeout_s, 30.0) + wait_s + RPC_MARGIN_S)

    # Health.
    def verdicts(self, *, job_id: str = "", limit: int = 100) -> list[Verdict]:
        """The failure detector's verdicts, newest first: one job's, or all the caller may see."""
        from rota.client.detector import Verdict
        from rota.client.detector import stub as detector_stub
        from rota.v1 import detector_pb2

        reply = self._call(detector_stub(self._channel).Verdicts, detector_pb2.VerdictsRequest(job_id=job_id, limit=limit))
        return [Verdict._from_proto(v) for v in reply.verdicts]

    def drain(self, node: str, *, undo: bool = False, reason: str = "") -> DrainResult:
        """Places nothing new on `node` (admin); running jobs go on. `undo` makes it ALIVE again."""
        from rota.client.detector import DrainResult
        from rota.client.detector import stub as detector_stub
        from rota.v1 import detector_pb2

        reply = self._call(detector_stub(self._channel).Drain, detector_pb2.DrainRequest(node=node, undo=undo, reason=reason))
        return DrainResult._from_proto(reply)

    def replan(
        self, *, job_id: str = "", tp: int = 0, pp: int = 0, dp: int = 0, speeds: Sequence[float] = (),
        layers: int = 0, microbatches: int = 0, apply: bool = False, wait: timedelta = timedelta(0),
        operation_id: str | None = None,
    ) -> ReplanResult:
        """The 3-D re-plan around slow (speed < 1) and dead (0) devices, with throughput before and
        after; with only `job_id`, the layout and speeds come from the job's reports and verdicts.

        `apply` (a job submitted with accepts_layout_changes): checkpoint the job and restart it
        with the new layout (ROTA_LAYOUT), waiting up to `wait` for its placement; safe to
        retry with the same `operation_id` (one is made if not given)."""
        from rota.client.detector import ReplanResult, replan_request
        from rota.client.detector import stub as detector_stub

        request = replan_request(
            job_id=job_id, tp=tp, pp=pp, dp=dp, speeds=speeds, layers=layers, microbatches=microbatches, apply=apply,
            wait_s=wait.total_seconds(), operation_id=(operation_id or f"replan-{uuid.uuid4()}") if apply else "",
        )
        deadline = self._op_deadline(0.0, wait.total_seconds()) if apply else None
        return ReplanResult._from_proto(self._call(detector_stub(self._channel).Replan, request, deadline))

    def devices(self, *, include_cleared: bool = False) -> list[DeviceHealth]:
        """GPUs the failure detector took out of the plan (and, with `include_cleared`, those put back)."""
        from rota.client.detector import DeviceHealth
        from rota.client.detector import stub as detector_stub
        from rota.v1 import detector_pb2

        reply = self._call(detector_stub(self._channel).Devices, detector_pb2.DevicesRequest(include_cleared=include_cleared))
        return [DeviceHealth._from_proto(d) for d in reply.devices]

    def clear_devices(self, node: str, gpus: Sequence[int] = (), *, reason: str = "") -> list[DeviceHealth]:
        """Puts `node`'s bad GPUs (all, or those in `gpus`) back into the plan (admin)."""
        from rota.client.detector import DeviceHealth
        from rota.client.detector import stub as detector_stub
        from rota.v1 import detector_pb2

        request = detector_pb2.ClearDevicesRequest(node=node, gpus=list(gpus), reason=reason)
        return [DeviceHealth._from_proto(d) for d in self._call(detector_stub(self._channel).ClearDevices, request).cleared]

    # Forecasts.
    def forecast(self, *, spec: JobSpec, quantile: float = 0.5) -> Forecast:
        """The job's predicted duration and GPU-hours (P50, P90, interval P10..P90), before submitting it."""
        from rota.client.forecast import Forecast, predict_request
        from rota.client.forecast import stub as forecast_stub

        reply = self._call(forecast_stub(self._channel).PredictJob, predict_request(_wire.spec_to_proto(spec), quantile))
        return Forecast._from_proto(reply, quantile)

    def push_traffic(self, *, app: str, samples: Sequence[TrafficSample]) -> int:
        """Records an app's hourly request counts; returns how many were new (a re-push changes nothing)."""
        from rota.client.forecast import stub as forecast_stub
        from rota.client.forecast import traffic_requests

        forecaster = forecast_stub(self._channel)
        return sum(self._call(forecaster.Observe, r).recorded for r in traffic_requests(app, samples))

    def demand_curve(self, *, app: str, horizon: int = 24, capacity: float = 0.0, max_swap: int = 0) -> DemandForecast:
        """The app's forecast GPUs per hour (capacity: requests per hour one replica serves)."""
        from rota.client.forecast import DemandForecast, demand_request
        from rota.client.forecast import stub as forecast_stub

        request = demand_request(app, horizon, capacity, max_swap)
        return DemandForecast._from_proto(self._call(forecast_stub(self._channel).DemandCurve, request))

    # Tenants.
    def create_tenant(
        self, name: str, *, share: float = 1.0, token_ttl: timedelta | None = None, guaranteed: int = 0,
        limit: int | None = None, gpu_limits: Mapping[str, int] | None = None, parent: str = "",
    ) -> tuple[Tenant, str]:
        """Returns the tenant and its bearer token (shown once), valid for `token_ttl`
        (None: until replaced by issue_token). InvalidArgumentError naming the field for a
        negative quota, a limit below the guarantee, an unknown parent or a cycle."""
        request = api_pb2.CreateTenantRequest(name=name, share=share, token_ttl=_duration(token_ttl),
                                              guaranteed=guaranteed, limit=limit, gpu_limits=dict(gpu_limits or {}),
                                              parent=parent)
        reply = self._call(self._tenants.CreateTenant, request)
        return _tenant(reply.tenant), reply.token

    def set_tenant_quota(self, name: str, *, guaranteed: int = 0, limit: int | None = None,
                         gpu_limits: Mapping[str, int] | None = None, parent: str = "") -> Tenant:
        """Replaces the tenant's quota (admin only); errors as create_tenant's."""
        request = api_pb2.SetTenantQuotaRequest(name=name, guaranteed=guaranteed, limit=limit,
                                                gpu_limits=dict(gpu_limits or {}), parent=parent)
        return _tenant(self._call(self._tenants.SetTenantQuota, request).tenant)

    # Users.
    def create_user(self, name: str, *, tenant: str = "", tenant_admin: bool = False,
                    token_ttl: timedelta | None = None) -> tuple[User, str]:
        """A user of `tenant` ("" = the caller's) and its token (shown once)."""
        request = api_pb2.CreateUserRequest(tenant=tenant, name=name, tenant_admin=tenant_admin,
                                            token_ttl=_duration(token_ttl))
        reply = self._call(self._tenants.CreateUser, request)
        return User._from_proto(reply.user), reply.token

    def list_users(self, *, tenant: str = "") -> list[User]:
        reply = self._call(self._tenants.ListUsers, api_pb2.ListUsersRequest(tenant=tenant))
        return [User._from_proto(u) for u in reply.users]

    def revoke_user(self, name: str, *, tenant: str = "") -> User:
        """The user's token is refused from the next call on."""
        reply = self._call(self._tenants.RevokeUser, api_pb2.RevokeUserRequest(tenant=tenant, name=name))
        return User._from_proto(reply.user)

    def issue_user_token(self, name: str, *, tenant: str = "", ttl: timedelta | None = None) -> tuple[User, str]:
        """A new token for the user (shown once); its old one is refused from then on."""
        request = api_pb2.IssueUserTokenRequest(tenant=tenant, name=name, token_ttl=_duration(ttl))
        reply = self._call(self._tenants.IssueUserToken, request)
        return User._from_proto(reply.user), reply.token

    def issue_token(self, name: str, *, ttl: timedelta | None = None) -> tuple[Tenant, str]:
        """A new bearer token for the tenant (shown once), valid for `ttl` (None: until
        replaced); its previous token is refused from then on. Admin only."""
        request = api_pb2.IssueTenantTokenRequest(name=name, token_ttl=_duration(ttl))
        reply = self._call(self._tenants.IssueTenantToken, request)
        return _tenant(reply.tenant), reply.token

    def whoami(self) -> tuple[bool, str]:
        """(admin, tenant) of this client's token: (True, "") for the admin, (False, NAME) for
        a tenant. UnauthenticatedError for a token the api refuses."""
        reply = self._call(self._tenants.WhoAmI, api_pb2.WhoAmIRequest())
        return reply.admin, reply.tenant

    def list_tenants(self) -> list[Tenant]:
        reply = self._call(self._tenants.ListTenants, api_pb2.ListTenantsRequest())
        return [_tenant(t) for t in reply.tenants]

    # Cluster.
    def nodes(self) -> list[Node]:
        reply = self._call(self._cluster.ListNodes, api_pb2.ListNodesRequest())
        return [
            Node(
                name=n.name,
                address=n.address,
                health=common_pb2.NodeHealth.Name(n.health).removeprefix("NODE_HEALTH_"),
                gpus=[Gpu(g.index, g.uuid, g.model, g.virtual, g.job_id, g.type) for g in n.gpus],
                last_heartbeat=_time(n.last_heartbeat),
                labels=dict(n.labels),
                cpus=n.cpus,
                memory_bytes=n.memory_bytes,
            )
            for n in reply.nodes
        ]

    # Ledger.
    @property
    def _ledger(self) -> ledger_pb2_grpc.LedgerServiceStub:
        # The api forwards rota.v1.LedgerService to the ledger, so it rides the same channel.
        from rota.v1 import ledger_pb2_grpc

        return ledger_pb2_grpc.LedgerServiceStub(self._channel)

    def usage(self, *, tenant: str = "", since: datetime | None = None, by: str = "tenant") -> list[UsageEntry]:
        """GPU-hours grouped `by` job, tenant, day (UTC) or gpu, since `since` (naive = UTC).
        A tenant token sees only its own tenant."""
        from rota.client.ledger import UsageEntry, to_unix
        from rota.v1 import ledger_pb2

        request = ledger_pb2.UsageRequest(tenant=tenant, since_unix=to_unix(since), by=by)
        return [UsageEntry._from_proto(r) for r in self._call(self._ledger.Usage, request).rows]

    def standings(self) -> Standings:
        """Per tenant over the last 24 hourly buckets: quota, entitled, deserved, used, F."""
        from rota.client.ledger import Standings
        from rota.v1 import ledger_pb2

        return Standings._from_proto(self._call(self._ledger.Standings, ledger_pb2.StandingsRequest()))

    def job_fairness(self, *, tenant: str = "") -> list[JobFairness]:
        """Per-job F = used / deserved of active jobs and those finished within the window."""
        from rota.client.ledger import JobFairness
        from rota.v1 import ledger_pb2

        reply = self._call(self._ledger.FairnessIndex, ledger_pb2.FairnessIndexRequest(tenant=tenant))
        return [JobFairness._from_proto(j) for j in reply.jobs]


__all__ = ["Client", "Job", "JobEvent", "JobSpec", "Node", "Gpu", "Tenant", "StateChange", "RotaError", "log_lines"]
