"""Every service the scheduling loop calls, built once by the composition root (main.py).

The loop never dials anything itself: tests hand it the same clients pointed at real
services on loopback, or at no address (forecasts, moves and standings then switch off).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rota.allocator.checkpoint_link import Mover
from rota.allocator.forecasts import Forecasts
from rota.allocator.ledger_link import LedgerStandings
from rota.common.config import Settings
from rota.common.tls import TLSFiles, open_aio_channel, tls_files

API_HEALTH_DEADLINE_S = 1.0


class ApiHealth:
    """Whether the api serves: the loop declares no node dead while the api (which takes the
    agents' heartbeats) is down, or every node would look silent at once."""

    def __init__(self, address: str, tls: TLSFiles | None) -> None:
        self._address, self._tls = address, tls
        self._stub: health_pb2_grpc.HealthStub | None = None

    async def serving(self) -> bool:
        if self._stub is None:  # an aio channel belongs to the event loop it is opened on: open it on the loop's
            self._stub = health_pb2_grpc.HealthStub(open_aio_channel(self._address, self._tls))
        try:
            reply = await self._stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=API_HEALTH_DEADLINE_S)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass(frozen=True)
class Peers:
    forecasts: Forecasts
    mover: Mover
    ledger: LedgerStandings
    api: ApiHealth

    @staticmethod
    def from_settings(settings: Settings) -> Peers:
        tls, token, addrs = tls_files(settings), settings.admin_token, settings.service_addrs
        return Peers(
            forecasts=Forecasts(addrs.get("forecaster"), token, settings.forecast_quantile, tls=tls),
            mover=Mover(addrs.get("checkpoint"), token, tls=tls),
            ledger=LedgerStandings(addrs.get("ledger"), token, tls=tls),
            api=ApiHealth(settings.api_addr, tls),
        )
