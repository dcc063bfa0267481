"""Composition root of the ledger service.

Its RPCs are built by a later issue; until then each answers UNIMPLEMENTED, while the
process already has health, reflection, auth, deadlines, tracing and graceful stop.
"""

from __future__ import annotations

import asyncio

from rota.common.bootstrap import serve_unimplemented
from rota.common.config import Settings
from rota.v1 import ledger_pb2, ledger_pb2_grpc


def main() -> None:
    asyncio.run(
        serve_unimplemented(
            "ledger", Settings.from_env(), ledger_pb2.DESCRIPTOR, "LedgerService",
            ledger_pb2_grpc.add_LedgerServiceServicer_to_server, ledger_pb2_grpc.LedgerServiceServicer,
        )
    )


if __name__ == "__main__":
    main()
