"""Composition root of the forecaster service.

Its RPCs are built by a later issue; until then each answers UNIMPLEMENTED, while the
process already has health, reflection, auth, deadlines, tracing and graceful stop.
"""

from __future__ import annotations

import asyncio

from rota.common.bootstrap import serve_unimplemented
from rota.common.config import Settings
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc


def main() -> None:
    asyncio.run(
        serve_unimplemented(
            "forecaster", Settings.from_env(), forecaster_pb2.DESCRIPTOR, "ForecasterService",
            forecaster_pb2_grpc.add_ForecasterServiceServicer_to_server, forecaster_pb2_grpc.ForecasterServiceServicer,
        )
    )


if __name__ == "__main__":
    main()
