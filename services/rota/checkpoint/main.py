"""Composition root of the checkpoint service.

Its RPCs are built by a later issue; until then each answers UNIMPLEMENTED, while the
process already has health, reflection, auth, deadlines, tracing and graceful stop.
"""

from __future__ import annotations

import asyncio

from rota.common.bootstrap import serve_unimplemented
from rota.common.config import Settings
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc


def main() -> None:
    asyncio.run(
        serve_unimplemented(
            "checkpoint", Settings.from_env(), checkpoint_pb2.DESCRIPTOR, "CheckpointService",
            checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server, checkpoint_pb2_grpc.CheckpointServiceServicer,
        )
    )


if __name__ == "__main__":
    main()
