"""Composition root of the detector: DetectorService plus the watcher that turns silent
rank heartbeats into verdicts, and the checkpoint service (ROTA_CHECKPOINT_ADDR) that
applied re-plans restart jobs through.

Tuning (environment): ROTA_DETECTOR_THRESHOLD (ratio, default 1.1), ROTA_DETECTOR_CONSECUTIVE
(k, default 5), ROTA_DETECTOR_WARMUP (iterations, default 50); ROTA_DETECTOR_BAD_RATIO (a
slow verdict at this ratio takes its device out of the plan, default 2.0); a rank stream's
timeout is three of the intervals it declares (default ROTA_HEARTBEAT_INTERVAL).
"""

from __future__ import annotations

import asyncio
import os

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.common.tls import tls_files
from rota.core.detection.devices import BEYOND_REPAIR_RATIO
from rota.core.detection.failslow import DetectorConfig
from rota.detector.applier import GrpcCheckpoint
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


def beyond_repair_from_env() -> float:
    try:
        return float(os.environ.get("ROTA_DETECTOR_BAD_RATIO") or BEYOND_REPAIR_RATIO)
    except ValueError as exc:
        raise ValueError(f"ROTA_DETECTOR_BAD_RATIO: {exc}") from exc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("detector", settings)
    address = settings.service_addrs.get("checkpoint")
    checkpoint = GrpcCheckpoint(address, settings.admin_token, tls_files(settings)) if address else None
    service = DetectorService(parts.db, parts.live, config=config_from_env(),
                              heartbeat_interval_s=settings.heartbeat_interval_s, checkpoint=checkpoint,
                              beyond_repair=beyond_repair_from_env())

    def register(server: grpc.aio.Server) -> list[str]:
        detector_pb2_grpc.add_DetectorServiceServicer_to_server(service, server)
        return [detector_pb2.DESCRIPTOR.services_by_name["DetectorService"].full_name]

    await parts.serve(register, background=[service.watch_forever])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
