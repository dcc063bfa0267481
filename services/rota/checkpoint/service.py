"""gRPC adapter of the checkpoint coordinator: validation, access checks, protos out.

A tenant token acts on its own tenant's jobs only; the admin token on every job.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from rota.checkpoint import repository as repo
from rota.checkpoint.coordinator import Coordinator
from rota.checkpoint.models import OperationRow
from rota.cluster.job_lifecycle import get_job
from rota.common import convert
from rota.common.auth import current_identity
from rota.common.db import Database
from rota.core.errors import DomainError, FailedPrecondition, InvalidArgument, NotFound
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc

MAX_TIMEOUT_S = 600.0


class StillRunning(DomainError):
    """The caller's deadline came first: the durable operation goes on without it."""

    code_name = "DEADLINE_EXCEEDED"


def _budget(context: grpc.aio.ServicerContext, cap_s: float) -> float:
    """How long a handler may wait for its operation: the caller's deadline, within the
    server's cap on every handler (the interceptor ends a handler there), less a margin to
    answer with the operation as it stands rather than DEADLINE_EXCEEDED."""
    remaining = context.time_remaining()
    return max(0.0, min(cap_s, remaining if remaining is not None else cap_s) - 1.0)


def _settled(op: OperationRow | None, reached: bool) -> OperationRow:
    if op is None:
        raise FailedPrecondition("the job does not register its state with rota.runtime")
    if op.state == repo.FAILED:
        raise FailedPrecondition(f"{op.kind} of {op.job_id} failed: {op.error}")
    if not reached:
        raise StillRunning(f"{op.kind} of {op.job_id} is still {op.state} (operation {op.id}); it goes on: "
                           f"see `rota checkpoints {op.job_id}`")
    return op


def _reason(text: str) -> str:
    if len(text) > 512:
        raise InvalidArgument("reason", f"at most 512 characters (got {len(text)})")
    return text


def _unix(t: object) -> float:
    return float(t.timestamp()) if t is not None else 0.0  # type: ignore[attr-defined]


def _seconds(name: str, value: float) -> float:
    if value < 0 or value > MAX_TIMEOUT_S:
        raise InvalidArgument(name, f"between 0 and {MAX_TIMEOUT_S:g} seconds, got {value:g}")
    return value


class CheckpointService(checkpoint_pb2_grpc.CheckpointServiceServicer):
    def __init__(self, db: Database, coordinator: Coordinator, handler_cap_s: float = 30.0) -> None:
        self.db = db
        self.coordinator = coordinator
        self.handler_cap_s = handler_cap_s  # Settings.default_deadline_s: the interceptor's cap

    async def _authorize(self, job_id: str) -> None:
        if not job_id:
            raise InvalidArgument("job_id", "required")
        job = await asyncio.to_thread(self.db.run, lambda s: get_job(s, job_id))
        if job is None or not current_identity().may_access(job.tenant):
            raise NotFound(f"job {job_id} not found")

    async def Checkpoint(self, request: checkpoint_pb2.CheckpointRequest, context: grpc.aio.ServicerContext) -> checkpoint_pb2.CheckpointResponse:
        await self._authorize(request.job_id)
        timeout = _seconds("timeout_seconds", request.timeout_seconds)
        found = await self.coordinator.checkpoint(request.job_id, request.operation_id, timeout, budget_s=_budget(context, self.handler_cap_s))
        op = _settled(found, found is not None and found.state == repo.DONE)
        d = op.detail
        return checkpoint_pb2.CheckpointResponse(
            image_id=op.image_id or "", step=int(d.get("step", 0)), bytes_written=int(d.get("stored_bytes", 0)),
            logical_bytes=int(d.get("logical_bytes", 0)), copy_seconds=float(d.get("copy_s", 0.0)),
            write_seconds=float(d.get("write_s", 0.0)), ranks=int(d.get("ranks", 0)),
        )

    async def Pause(self, request: checkpoint_pb2.PauseRequest, context: grpc.aio.ServicerContext) -> checkpoint_pb2.PauseResponse:
        await self._authorize(request.job_id)
        found = await self.coordinator.pause(request.job_id, request.operation_id,
                                             _seconds("timeout_seconds", request.timeout_seconds), budget_s=_budget(context, self.handler_cap_s))
        op = _settled(found, found is not None and found.state not in (repo.REQUESTED, repo.COPYING))
        d = op.detail
        return checkpoint_pb2.PauseResponse(
            image_id=op.image_id or "", step=int(d.get("step", 0)), pause_seconds=float(d.get("pause_s", 0.0)),
            node=str(d.get("node", "")), ranks=int(d.get("ranks", 0)),
        )

    async def Resume(self, request: checkpoint_pb2.ResumeRequest, context: grpc.aio.ServicerContext) -> checkpoint_pb2.ResumeResponse:
        await self._authorize(request.job_id)
        found, placed = await self.coordinator.resume(
            request.job_id, request.operation_id, request.node, _seconds("wait_seconds", request.wait_seconds),
            budget_s=_budget(context, self.handler_cap_s))
        op = _settled(found, found is not None and found.state == repo.DONE)
        return checkpoint_pb2.ResumeResponse(
            node=placed.node, gpus=placed.gpus, image_id=str(op.detail.get("image_id", "")),
            step=int(op.detail.get("step", 0)),
            job_state=convert.state_value(placed.state),
        )

    async def Migrate(self, request: checkpoint_pb2.MigrateRequest, context: grpc.aio.ServicerContext) -> checkpoint_pb2.MigrateResponse:
        await self._authorize(request.job_id)
        found, placed = await self.coordinator.migrate(
            request.job_id, request.operation_id, request.target_node,
            _seconds("timeout_seconds", request.timeout_seconds), _seconds("wait_seconds", request.wait_seconds),
            budget_s=_budget(context, self.handler_cap_s), reason=_reason(request.reason))
        op = _settled(found, found is not None and found.state == repo.DONE)
        d = op.detail
        placed_in = time.time() - float(d.get("requested_at", time.time())) if placed.node else 0.0
        return checkpoint_pb2.MigrateResponse(
            node=placed.node, gpus=placed.gpus, image_id=op.image_id or "", step=int(d.get("step", 0)),
            from_node=str(d.get("node", "")), pause_seconds=float(d.get("pause_s", 0.0)), migrate_seconds=placed_in,
        )

    async def ListImages(self, request: checkpoint_pb2.ListImagesRequest, context: grpc.aio.ServicerContext) -> checkpoint_pb2.ListImagesResponse:
        await self._authorize(request.job_id)

        def read(s):  # type: ignore[no-untyped-def]
            return repo.list_images(s, request.job_id), list(repo.recent_operations(s, request.job_id))

        views, ops = await asyncio.to_thread(self.db.run, read)
        return checkpoint_pb2.ListImagesResponse(
            images=[
                checkpoint_pb2.CheckpointImage(
                    id=v.image.id, job_id=v.image.job_id, sequence=v.image.sequence,
                    node=v.image.node, ranks=v.image.ranks, step=v.image.step,
                    image_kind=convert.enum_value(checkpoint_pb2.ImageKind, "IMAGE_KIND_", v.image.kind),
                    image_state=convert.enum_value(checkpoint_pb2.ImageState, "IMAGE_STATE_", v.image.state),
                    logical_bytes=v.image.logical_bytes, stored_bytes=v.image.stored_bytes, unique_bytes=v.unique_bytes,
                    chunks=v.image.chunks, copy_seconds=v.image.copy_s, write_seconds=v.image.write_s,
                    created_unix=_unix(v.image.created_at), error=v.image.error,
                )
                for v in views
            ],
            operations=[_operation(op) for op in ops],
        )


def _operation(op: OperationRow) -> checkpoint_pb2.CheckpointOperation:
    return checkpoint_pb2.CheckpointOperation(
        id=op.id, operation_id=op.request_id or "", target_node=op.target_node,
        operation_kind=convert.enum_value(checkpoint_pb2.OperationKind, "OPERATION_KIND_", op.kind),
        operation_state=convert.enum_value(checkpoint_pb2.OperationState, "OPERATION_STATE_", op.state),
        image_id=op.image_id or "", error=op.error, created_unix=_unix(op.created_at), finished_unix=_unix(op.finished_at),
        streamed=bool(op.detail.get("streamed")), source_node=str(op.detail.get("node", "")),
        pause_seconds=float(op.detail.get("pause_s", 0.0)), write_seconds=float(op.detail.get("write_s", 0.0)),
    )
