"""Composition root of the forecaster: ForecasterService, plus the collector that observes
every finished job (ROTA_LEDGER_INTERVAL sets its period too)."""

from __future__ import annotations

import asyncio

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.forecaster.collector import CompletionCollector
from rota.forecaster.service import ForecasterService
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("forecaster", settings)

    def register(server: grpc.aio.Server) -> list[str]:
        forecaster_pb2_grpc.add_ForecasterServiceServicer_to_server(ForecasterService(parts.db), server)
        return [forecaster_pb2.DESCRIPTOR.services_by_name["ForecasterService"].full_name]

    collector = CompletionCollector(parts.db, settings.ledger_interval_s)
    await parts.serve(register, background=[collector.run_forever])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
