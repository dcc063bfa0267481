"""Composition root of the checkpoint coordinator: CheckpointService, recovery of the
operations a previous coordinator left unfinished, periodic checkpoints, and GC.

Settings: see `rota.imagestore.settings` (ROTA_CHUNK_STORE, ROTA_CHECKPOINT_* variables).
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from rota.checkpoint import gc
from rota.checkpoint.coordinator import Coordinator, GrpcAgents
from rota.checkpoint.service import CheckpointService
from rota.cluster.job_lifecycle import Events
from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc

log = logging.getLogger("rota.checkpoint")


async def serve(settings: Settings) -> None:
    parts = ServiceParts("checkpoint", settings)
    config = settings.checkpoint
    store = config.store()

    def publish(events: Events) -> None:
        try:
            parts.live.publish_job_events(events.items)
        except Exception as exc:  # noqa: BLE001 - Redis is a cache; Postgres has it all
            log.warning("publishing job events failed: %s", exc)

    coordinator = Coordinator(parts.db, GrpcAgents(parts.agents), config, publish)

    def register(server: grpc.aio.Server) -> list[str]:
        checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server(CheckpointService(parts.db, coordinator, settings.default_deadline_s), server)
        return [checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name]

    async def recover() -> None:
        # The recovered operations go on as the coordinator's own tasks.
        count = await coordinator.recover()
        if count:
            log.info("finishing or rolling back %d unfinished checkpoint operations", count)

    await parts.serve(register, background=[
        recover, coordinator.run_periodic_forever, lambda: gc.run_forever(parts.db, store, config),
    ])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
