"""Composition root of the allocator: the scheduling loop plus AllocatorService."""

from __future__ import annotations

import asyncio

import grpc

from rota.allocator.loop import SchedulingLoop
from rota.allocator.peers import Peers
from rota.allocator.service import AllocatorService
from rota.allocator.wakeups import Wakeups
from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.v1 import allocator_pb2, allocator_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("allocator", settings)
    wakeups = Wakeups(parts.live.client, parts.live.wake_channel)
    loop = SchedulingLoop(settings, parts.db, parts.live, parts.agents, Peers.from_settings(settings), wakeups=wakeups)

    def register(server: grpc.aio.Server) -> list[str]:
        allocator_pb2_grpc.add_AllocatorServiceServicer_to_server(AllocatorService(parts.db, settings), server)
        return [allocator_pb2.DESCRIPTOR.services_by_name["AllocatorService"].full_name]

    try:
        await parts.serve(register, background=[loop.run_forever])
    finally:
        wakeups.close()
        loop.leadership.release()


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
