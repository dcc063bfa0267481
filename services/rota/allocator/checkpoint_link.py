"""The allocator's hand on the checkpoint coordinator: moves of started jobs run as Migrate.

A preemption and a lease yield are a migration without a target (pause, then back to the
queue, resumed from the image wherever the plan puts it); a fragmentation repair is one
with a target node. The coordinator keeps each move a durable operation, so the loop
fires it in the background and moves on: the next cycle sees the job PAUSED and its GPUs
free. A move the coordinator refuses (the job never reaches a safe point, it stopped
checkpointing) calls `on_refused`, and the job is left alone for a while.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc

from rota.common.tls import TLSFiles, open_aio_channel
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc

log = logging.getLogger(__name__)
MOVE_DEADLINE_S = 300.0  # the operation goes on durably past it; this only bounds our wait
REFUSED_FOR_S = 600.0  # a job whose move was refused is not tried again for this long
SETTLE_S = 600.0  # a job that was moved is not moved again for this long (no bouncing)

Refused = Callable[[str], Awaitable[None]]


class Mover:
    def __init__(self, address: str | None, admin_token: str, *, tls: TLSFiles | None = None) -> None:
        self._stub = checkpoint_pb2_grpc.CheckpointServiceStub(open_aio_channel(address, tls)) if address else None
        self._metadata = (("authorization", f"Bearer {admin_token}"),)
        self._moving: dict[str, asyncio.Task[None]] = {}
        self._resting: dict[str, float] = {}  # job -> monotonic time it may be tried again (or moved again)

    @property
    def available(self) -> bool:
        """Whether a checkpoint service is configured: without one, nothing is moved."""
        return self._stub is not None

    def busy(self) -> frozenset[str]:
        """Jobs not to plan a move for: one is under way, or was made or refused lately."""
        now = time.monotonic()
        self._resting = {j: until for j, until in self._resting.items() if until > now}
        return frozenset(self._moving) | frozenset(self._resting)

    def start(self, job_id: str, *, reason: str, target: str = "", on_refused: Refused | None = None) -> bool:
        """Begins moving the job (to `target`, or back to the queue); False if it cannot."""
        if self._stub is None or job_id in self.busy():
            return False
        task = asyncio.ensure_future(self._migrate(job_id, target, reason, on_refused))
        self._moving[job_id] = task
        task.add_done_callback(lambda _: self._moving.pop(job_id, None))
        return True

    async def _migrate(self, job_id: str, target: str, reason: str, on_refused: Refused | None) -> None:
        assert self._stub is not None
        # One id per move: a transport-level retry of this call joins the same operation.
        request = checkpoint_pb2.MigrateRequest(
            job_id=job_id, operation_id=f"allocator-{uuid.uuid4().hex}", target_node=target, reason=reason[:512])
        try:
            await self._stub.Migrate(request, timeout=MOVE_DEADLINE_S, metadata=self._metadata)
            self._resting[job_id] = time.monotonic() + SETTLE_S
            log.info("moved %s%s: %s", job_id, f" to {target}" if target else " back to the queue", reason)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                log.info("move of %s still under way at our deadline; the coordinator finishes it", job_id)
                return
            log.warning("move of %s refused (%s): %s", job_id, exc.code().name, exc.details())
            self._resting[job_id] = time.monotonic() + REFUSED_FOR_S
            if on_refused is not None and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                await on_refused(exc.details() or "")
        except Exception:  # noqa: BLE001 - a background move must be logged, never lost
            log.exception("move of %s failed", job_id)

    async def close(self) -> None:
        for task in list(self._moving.values()):
            task.cancel()
