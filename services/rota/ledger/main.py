"""Composition root of the ledger service: LedgerService plus the collector loop.

ROTA_LEDGER_INTERVAL (seconds, default 5) sets how often placements are turned into
usage rows; standings read usage up to the last run. ROTA_GPU_TYPE_RATES ("h100=3.2,a100=1",
over the defaults of rota.core.fairness.rates) sets what a GPU-second of each type counts
for in weighted GPU-time, which fairness reads.
"""

from __future__ import annotations

import asyncio

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.ledger.collector import Collector
from rota.ledger.metrics import register_fairness_metrics
from rota.ledger.service import LedgerService
from rota.v1 import ledger_pb2, ledger_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("ledger", settings)
    collector = Collector(parts.db, settings.ledger_interval_s, settings.gpu_type_rates)
    register_fairness_metrics(parts.db)  # tenants' F and GPU-time on /metrics, read at scrape time

    def register(server: grpc.aio.Server) -> list[str]:
        ledger_pb2_grpc.add_LedgerServiceServicer_to_server(LedgerService(
            parts.db, rates=settings.gpu_type_rates, policy=settings.policy, lease_s=settings.fair_lease_s), server)
        return [ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"].full_name]

    await parts.serve(register, background=[collector.run_forever])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
