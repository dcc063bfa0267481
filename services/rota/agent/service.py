"""AgentService adapter: Launch, Resize, Stop, Status and ReadLog over the process table;
Checkpoint, Restore and ImageStatus over the agent's checkpoints (`rota.agent.checkpoints`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc

from rota.agent.cgroups import Limits
from rota.agent.checkpoints import STREAM_WAIT_S, AgentCheckpoints, ImageRecord
from rota.agent.processes import GangLaunch, LocalJob, ProcessTable
from rota.agent.streaming import IMAGE_STATES, StagedSource
from rota.common.auth import current_identity
from rota.common.layouts import layout_text
from rota.core.arrays import task_environment
from rota.core.errors import InvalidArgument, NotFound
from rota.core.quantities import parse_memory
from rota.v1 import agent_pb2, agent_pb2_grpc, api_pb2, checkpoint_pb2, common_pb2

MAX_LOG_CHUNK = 1024 * 1024
MAX_LAYOUT_BYTES = 64 * 1024  # a re-plan of the largest layout the detector takes, with room


def report_of(job: LocalJob) -> api_pb2.AgentJobReport:
    code = job.exit_code()
    state = job.state_for(code)  # one read of the exit: see LocalJob.state_for
    return api_pb2.AgentJobReport(
        job_id=job.job_id,
        epoch=job.epoch,
        state=common_pb2.JobState.Value("JOB_STATE_" + state),
        exit_code=code or 0,
        error=job.error() if state == "FAILED" else "",
        progress_json=job.progress_json(),
    )


def image_status_of(record: ImageRecord | None) -> agent_pb2.AgentImageStatusResponse:
    if record is None:
        return agent_pb2.AgentImageStatusResponse(image_state=checkpoint_pb2.IMAGE_STATE_UNKNOWN)
    manifest = json.dumps(record.manifest).encode() if record.manifest is not None else b""
    return agent_pb2.AgentImageStatusResponse(
        image_state=IMAGE_STATES.get(record.state, checkpoint_pb2.IMAGE_STATE_UNSPECIFIED),
        error=record.error, manifest_json=manifest, logical_bytes=record.logical_bytes,
        written_bytes=record.written_bytes, chunks=record.chunks, write_seconds=record.write_s,
        step=record.step, ranks=record.ranks,
    )


def check_layout(layout: str) -> None:
    """ROTA_LAYOUT must be a JSON object the job can read, and fit in an environment variable."""
    if not layout:
        return
    if len(layout) > MAX_LAYOUT_BYTES or "\x00" in layout:
        raise InvalidArgument("layout", f"at most {MAX_LAYOUT_BYTES} characters, no NUL")
    try:
        parsed = json.loads(layout)
    except ValueError as exc:
        raise InvalidArgument("layout", f"not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise InvalidArgument("layout", "must be a JSON object")


def limits_of(spec: common_pb2.JobSpec) -> Limits:
    """The cgroup limits a job's spec asks for (memory per node, CPUs)."""
    try:
        memory = parse_memory(spec.memory) if spec.memory else 0
    except ValueError as exc:
        raise InvalidArgument("job.spec.memory", str(exc)) from None
    return Limits(memory_bytes=memory, cpus=spec.cpus if spec.HasField("cpus") else None)


def array_env(job: common_pb2.Job) -> dict[str, str]:
    """A job array's task learns its array and index (and Slurm's names of them); the
    validation keeps a job's own env free of ROTA_ names, so nothing is overridden."""
    return task_environment(job.array_id, job.array_index) if job.array_id else {}


class AgentRuntime:
    """The agent's state shared by the gRPC handlers and the heartbeat loop."""

    def __init__(self, node: str, table: ProcessTable, virtual: bool, checkpoints: AgentCheckpoints) -> None:
        self.node = node
        self.table = table
        self.virtual = virtual
        self.checkpoints = checkpoints
        self.staged = StagedSource(checkpoints, checkpoints.settings.stream_mbps)  # a streaming migration's source
        # Serialises launches and stops so fencing checks and process starts do not interleave.
        self.lock = asyncio.Lock()
        # Set by a launch: the heartbeat loop reports the new process without waiting out
        # its interval (the control plane learns RUNNING from heartbeats).
        self.launched = asyncio.Event()

    async def launch(self, job: common_pb2.Job, epoch: int, resume_image: str = "", layout: str = "",
                     resume_source: str = "", resume_fallback_image: str = "") -> LocalJob:
        if not job.id or epoch <= 0:
            raise InvalidArgument("epoch" if job.id else "job.id", "required")
        check_layout(layout)
        spec = job.spec
        gang = self._gang(job)
        limits = limits_of(spec)
        time_limit = spec.time_limit_seconds if spec.HasField("time_limit_seconds") else None
        restore = self.checkpoints.restore_dir(job.id, epoch) if resume_image else None
        async with self.lock:
            current = self.table.jobs.get(job.id)
            fresh = current is None or current.epoch != epoch
            local = await asyncio.to_thread(
                self.table.launch, job.id, epoch, list(job.gpus), list(spec.command), spec.workdir,
                {**spec.env, **array_env(job)}, self.virtual, restore, layout, gang,
                replicas=spec.kind == common_pb2.JOB_KIND_REALTIME,  # one process per replica (rota.agent.replicaset)
                guest_of=job.guest_of, limits=limits, time_limit_s=time_limit,
            )
        if restore is not None and fresh:
            # The image is made ready while the interpreter and torch start up; a migration's
            # image still being written is streamed from its source agent meanwhile.
            wait_s = STREAM_WAIT_S if resume_source else 0.0
            self.checkpoints.start_restore(restore, resume_image, wait_s, resume_source, resume_fallback_image)
        if fresh:
            self.launched.set()
        return local

    def _gang(self, job: common_pb2.Job) -> GangLaunch | None:
        """This node's part of a gang job (None for a job on one node)."""
        if not job.HasField("gang") or len(job.gang.nodes) < 2:
            return None
        nodes = tuple(job.gang.nodes)
        if self.node not in nodes:
            raise InvalidArgument("job.gang.nodes", f"node {self.node} is not one of the gang's nodes {list(nodes)}")
        if not job.gang.master_addr or not 0 < job.gang.master_port < 65536:
            raise InvalidArgument("job.gang.master_addr", "a gang needs its rendezvous host and port")
        return GangLaunch(nodes, nodes.index(self.node), job.gang.ranks_per_node or len(job.gpus),
                          job.gang.master_addr, job.gang.master_port)

    async def resize(self, job_id: str, epoch: int, gpus: list[int]) -> LocalJob:
        if not job_id or epoch <= 0:
            raise InvalidArgument("epoch" if job_id else "job_id", "required")
        if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
            raise InvalidArgument("gpu_indices", "must be distinct GPU indices, at least one")
        async with self.lock:
            return await asyncio.to_thread(self.table.resize, job_id, epoch, gpus)

    async def stop(self, job_id: str, epoch: int, reason: str, grace_s: float, *, verdict: bool = False) -> bool:
        async with self.lock:
            return await asyncio.to_thread(self.table.stop, job_id, epoch, reason, grace_s, verdict=verdict)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, runtime: AgentRuntime) -> None:
        self.runtime = runtime

    async def Launch(self, request: agent_pb2.LaunchRequest, context: grpc.aio.ServicerContext) -> agent_pb2.LaunchResponse:
        current_identity().require_admin()
        job = await self.runtime.launch(request.job, request.epoch, request.resume_image, layout_text(request),
                                        request.resume_source, request.resume_fallback_image)
        return agent_pb2.LaunchResponse(report=report_of(job))

    async def Restore(self, request: agent_pb2.AgentRestoreRequest, context: grpc.aio.ServicerContext) -> agent_pb2.AgentRestoreResponse:
        current_identity().require_admin()
        if not request.image_id:
            raise InvalidArgument("image_id", "required")
        job = await self.runtime.launch(request.job, request.epoch, request.image_id)
        return agent_pb2.AgentRestoreResponse(report=report_of(job))

    async def Checkpoint(self, request: agent_pb2.AgentCheckpointRequest, context: grpc.aio.ServicerContext) -> agent_pb2.AgentCheckpointResponse:
        current_identity().require_admin()
        timeout = request.timeout_seconds if request.timeout_seconds > 0 else self.runtime.checkpoints.settings.timeout_s
        record = await self.runtime.checkpoints.checkpoint(
            request.job_id, request.epoch, request.image_id, request.pause, timeout, request.skip_unregistered,
            request.seq, tuple(request.local_ranks),
        )
        if record is None:
            return agent_pb2.AgentCheckpointResponse(image_id=request.image_id, registered=False)
        return agent_pb2.AgentCheckpointResponse(
            image_id=record.image_id, registered=True, step=record.step, ranks=record.ranks,
            logical_bytes=record.logical_bytes, copy_seconds=record.copy_s, pause_seconds=record.pause_s,
        )

    async def ImageStatus(self, request: agent_pb2.AgentImageStatusRequest, context: grpc.aio.ServicerContext) -> agent_pb2.AgentImageStatusResponse:
        current_identity().require_admin()
        record = self.runtime.checkpoints.status(request.image_id)
        return image_status_of(record)

    async def DescribeStaged(self, request: agent_pb2.DescribeStagedRequest,
                             context: grpc.aio.ServicerContext) -> agent_pb2.DescribeStagedResponse:
        current_identity().require_admin()
        return self.runtime.staged.describe(request.image_id)

    async def FetchStaged(self, request: agent_pb2.FetchStagedRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[agent_pb2.FetchStagedResponse]:
        current_identity().require_admin()
        async for piece in self.runtime.staged.fetch(request):
            yield piece

    async def Stop(self, request: agent_pb2.StopRequest, context: grpc.aio.ServicerContext) -> agent_pb2.StopResponse:
        current_identity().require_admin()
        grace = request.grace_seconds if request.grace_seconds > 0 else 10.0
        stopped = await self.runtime.stop(request.job_id, request.epoch, request.reason or "stop requested", grace)
        return agent_pb2.StopResponse(stopped=stopped)

    async def Resize(self, request: agent_pb2.ResizeRequest, context: grpc.aio.ServicerContext) -> agent_pb2.ResizeResponse:
        current_identity().require_admin()
        job = await self.runtime.resize(request.job_id, request.epoch, list(request.gpu_indices))
        return agent_pb2.ResizeResponse(report=report_of(job))

    async def Status(self, request: agent_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> agent_pb2.StatusResponse:
        current_identity().require_admin()
        jobs = [report_of(j) for j in self.runtime.table.jobs.values()]
        return agent_pb2.StatusResponse(node=self.runtime.node, jobs=jobs, epoch=self.runtime.table.max_epoch)

    async def ReadLog(self, request: agent_pb2.ReadLogRequest, context: grpc.aio.ServicerContext) -> agent_pb2.ReadLogResponse:
        current_identity().require_admin()
        path = self.runtime.table.find_log(request.job_id)
        if path is None or not path.exists():
            raise NotFound(f"no log for job {request.job_id} on {self.runtime.node}")
        size = min(request.max_bytes or MAX_LOG_CHUNK, MAX_LOG_CHUNK)

        def read() -> bytes:
            with path.open("rb") as f:
                f.seek(request.offset)
                return f.read(size)

        data = await asyncio.to_thread(read)
        job = self.runtime.table.jobs.get(request.job_id)
        finished = job is None or job.exit_code() is not None
        return agent_pb2.ReadLogResponse(data=data, offset=request.offset + len(data), finished=finished)
