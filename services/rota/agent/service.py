"""AgentService adapter: Launch, Resize, Stop, Status and ReadLog over the process table."""

from __future__ import annotations

import asyncio

import grpc

from rota.agent.processes import LocalJob, ProcessTable
from rota.common.auth import current_identity
from rota.common.errors import InvalidArgument, NotFound
from rota.v1 import agent_pb2, agent_pb2_grpc, api_pb2, common_pb2

MAX_LOG_CHUNK = 1024 * 1024


def report_of(job: LocalJob) -> api_pb2.AgentJobReport:
    code = job.exit_code()
    state = job.state()
    return api_pb2.AgentJobReport(
        job_id=job.job_id,
        epoch=job.epoch,
        state=common_pb2.JobState.Value("JOB_STATE_" + state),
        exit_code=code or 0,
        error=job.error() if state == "FAILED" else "",
        progress_json=job.progress_json(),
    )


class AgentRuntime:
    """The agent's state shared by the gRPC handlers and the heartbeat loop."""

    def __init__(self, node: str, table: ProcessTable, virtual: bool) -> None:
        self.node = node
        self.table = table
        self.virtual = virtual
        # Serialises launches and stops so fencing checks and process starts do not interleave.
        self.lock = asyncio.Lock()

    async def launch(self, job: common_pb2.Job, epoch: int) -> LocalJob:
        if not job.id or epoch <= 0:
            raise InvalidArgument("epoch" if job.id else "job.id", "required")
        spec = job.spec
        async with self.lock:
            return await asyncio.to_thread(
                self.table.launch, job.id, epoch, list(job.gpus), list(spec.command), spec.workdir,
                dict(spec.env), self.virtual,
            )

    async def resize(self, job_id: str, epoch: int, gpus: list[int]) -> LocalJob:
        if not job_id or epoch <= 0:
            raise InvalidArgument("epoch" if job_id else "job_id", "required")
        if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
            raise InvalidArgument("gpu_indices", "must be distinct GPU indices, at least one")
        async with self.lock:
            return await asyncio.to_thread(self.table.resize, job_id, epoch, gpus)

    async def stop(self, job_id: str, epoch: int, reason: str, grace_s: float) -> bool:
        async with self.lock:
            return await asyncio.to_thread(self.table.stop, job_id, epoch, reason, grace_s)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, runtime: AgentRuntime) -> None:
        self.runtime = runtime

    async def Launch(self, request: agent_pb2.LaunchRequest, context: grpc.aio.ServicerContext) -> agent_pb2.LaunchResponse:
        current_identity().require_admin()
        job = await self.runtime.launch(request.job, request.epoch)
        return agent_pb2.LaunchResponse(report=report_of(job))

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
