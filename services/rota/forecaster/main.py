"""Composition root of the forecaster: ForecasterService over the shared Postgres."""

from __future__ import annotations

import asyncio

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.forecaster.service import ForecasterService
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("forecaster", settings)

    def register(server: grpc.aio.Server) -> list[str]:
        forecaster_pb2_grpc.add_ForecasterServiceServicer_to_server(ForecasterService(parts.db), server)
        return [forecaster_pb2.DESCRIPTOR.services_by_name["ForecasterService"].full_name]

    await parts.serve(register)


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
