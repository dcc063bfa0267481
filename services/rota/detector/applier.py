"""The executor of an applied re-plan: the checkpoint service migrates the job (docs/design.md §6, §7).

Migrate pauses the job at a safe point (its state copied into an image), then resumes it:
PENDING with that image, so the allocator places it again and the agent launches it with
the layout the detector stored, from the image's step. The detector calls as the admin:
it has already checked that the caller may see the job.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from rota.common.tls import TLSFiles, open_aio_channel
from rota.core.errors import DomainError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc

# Codes after which the migration certainly did not happen (the stored layout is undone);
# after any other (a deadline, an outage) it may still go on, so the layout stays.
DEFINITE = frozenset({
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.ALREADY_EXISTS,
})


class MigrationGoesOn(DomainError):
    """The deadline came before the restart: the durable migration continues without us."""

    code_name = "DEADLINE_EXCEEDED"


class MigrateFailed(Exception):
    """Carries the domain error to answer with, and whether the migration surely did not happen."""

    def __init__(self, error: DomainError, definite: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.definite = definite


class CheckpointPort(Protocol):
    async def migrate(self, request: checkpoint_pb2.MigrateRequest, timeout_s: float) -> checkpoint_pb2.MigrateResponse: ...


def _domain(code: grpc.StatusCode, details: str, job_id: str) -> DomainError:
    what = f"migrating {job_id} to apply its re-plan: {details}"
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(what)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(what)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument("job_id", what)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return MigrationGoesOn(f"{what}; the job restarts with the new layout when it completes "
                               f"(see rota checkpoints {job_id})")
    return Unavailable(f"{what} ({code.name}); the job restarts with the new layout at its next launch")


class GrpcCheckpoint:
    """CheckpointService over one lazily opened channel (the detector may never apply a plan)."""

    def __init__(self, address: str, admin_token: str, tls: TLSFiles | None = None) -> None:
        self.address = address
        self.tls = tls
        self.metadata = (("authorization", f"Bearer {admin_token}"),)
        self._stub: checkpoint_pb2_grpc.CheckpointServiceAsyncStub | None = None

    async def migrate(self, request: checkpoint_pb2.MigrateRequest, timeout_s: float) -> checkpoint_pb2.MigrateResponse:
        if self._stub is None:
            self._stub = checkpoint_pb2_grpc.CheckpointServiceStub(open_aio_channel(self.address, self.tls))
        try:
            reply: checkpoint_pb2.MigrateResponse = await self._stub.Migrate(
                request, timeout=timeout_s, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise MigrateFailed(_domain(code, exc.details() or "", request.job_id), code in DEFINITE) from exc
        return reply
