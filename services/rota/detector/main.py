"""Composition root of the detector service.

Its RPCs are built by a later issue; until then each answers UNIMPLEMENTED, while the
process already has health, reflection, auth, deadlines, tracing and graceful stop.
"""

from __future__ import annotations

import asyncio

from rota.common.bootstrap import serve_unimplemented
from rota.common.config import Settings
from rota.v1 import detector_pb2, detector_pb2_grpc


def main() -> None:
    asyncio.run(
        serve_unimplemented(
            "detector", Settings.from_env(), detector_pb2.DESCRIPTOR, "DetectorService",
            detector_pb2_grpc.add_DetectorServiceServicer_to_server, detector_pb2_grpc.DetectorServiceServicer,
        )
    )


if __name__ == "__main__":
    main()
