"""Composition root of the checkpoint service.

Its RPCs are built by a later issue; until then the generated base servicer answers
UNIMPLEMENTED for each of them (never a made-up answer), while the process already has
health, reflection, auth, deadlines, tracing and graceful stop like every service.
"""

from __future__ import annotations

import asyncio

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("checkpoint", settings)

    def register(server: grpc.aio.Server) -> list[str]:
        checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server(checkpoint_pb2_grpc.CheckpointServiceServicer(), server)
        return [checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name]

    await parts.serve(register)


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
