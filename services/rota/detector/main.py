"""Composition root of the detector: DetectorService plus the watcher that turns silent
rank heartbeats into verdicts, and the checkpoint service (ROTA_CHECKPOINT_ADDR) that
applied re-plans restart jobs through.

Tuning (environment, read into its Settings): ROTA_DETECTOR_MODE (cusum, the default, or streak),
ROTA_DETECTOR_COMMON_MODE (1, the default, or 0), ROTA_DETECTOR_THRESHOLD (ratio, default 1.1),
ROTA_DETECTOR_CONSECUTIVE (k of the streak rule, default 5), ROTA_DETECTOR_WARMUP (iterations, default 50); ROTA_DETECTOR_BAD_RATIO (a
slow verdict at this ratio takes its device out of the plan, default 2.0); a rank stream's
timeout is three of the intervals it declares (default ROTA_HEARTBEAT_INTERVAL).
"""

from __future__ import annotations

import asyncio

import grpc

from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.common.tls import tls_files
from rota.detector.applier import GrpcCheckpoint
from rota.detector.service import DetectorService
from rota.v1 import detector_pb2, detector_pb2_grpc


async def serve(settings: Settings) -> None:
    parts = ServiceParts("detector", settings)
    address = settings.service_addrs.get("checkpoint")
    checkpoint = GrpcCheckpoint(address, settings.admin_token, tls_files(settings)) if address else None
    service = DetectorService(parts.db, parts.live, config=settings.detector,
                              heartbeat_interval_s=settings.heartbeat_interval_s, checkpoint=checkpoint,
                              beyond_repair=settings.detector_bad_ratio)

    def register(server: grpc.aio.Server) -> list[str]:
        detector_pb2_grpc.add_DetectorServiceServicer_to_server(service, server)
        return [detector_pb2.DESCRIPTOR.services_by_name["DetectorService"].full_name]

    await parts.serve(register, background=[service.watch_forever])


def main() -> None:
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
