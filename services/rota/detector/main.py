"""Composition root of the detector: DetectorService plus the watcher that turns silent
rank heartbeats into verdicts.

Tuning (environment): ROTA_DETECTOR_THRESHOLD (ratio, default 1.1), ROTA_DETECTOR_CONSECUTIVE
(k, default 5), ROTA_DETECTOR_WARMUP (iterations, default 50); a rank stream's timeout is
three of the intervals it declares (default ROTA_HEARTBEAT_INTERVAL).
"""

from __future__ import annotations

import asyncio
import os

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.detector.failslow import DetectorConfig
from rota.detector.service import DetectorService
from rota.v1 import detector_pb2, detector_pb2_grpc


def config_from_env() -> DetectorConfig:
    defaults = DetectorConfig()
    try:
        return DetectorConfig(
            threshold=float(os.environ.get("ROTA_DETECTOR_THRESHOLD") or defaults.threshold),
            consecutive=int(os.environ.get("ROTA_DETECTOR_CONSECUTIVE") or defaults.consecutive),
            warmup=int(os.environ.get("ROTA_DETECTOR_WARMUP") or defaults.warmup),
        )
    except ValueError as exc:
        raise ValueError(f"ROTA_DETECTOR_*: {exc}") from exc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("detector", settings)
    service = DetectorService(parts.db, parts.live, config=config_from_env(),
                              heartbeat_interval_s=settings.heartbeat_interval_s)

    def register(server: grpc.aio.Server) -> list[str]:
        detector_pb2_grpc.add_DetectorServiceServicer_to_server(service, server)
        return [detector_pb2.DESCRIPTOR.services_by_name["DetectorService"].full_name]

    await parts.serve(register, background=[service.watch_forever])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
