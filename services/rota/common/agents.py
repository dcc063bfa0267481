"""Channels to node agents, shared by the control-plane services that command them."""

from __future__ import annotations

import grpc

from rota.common.tls import TLSFiles, open_aio_channel
from rota.v1 import agent_pb2_grpc


class AgentClients:
    def __init__(self, admin_token: str, *, tls: TLSFiles | None = None) -> None:
        self._tls = tls
        self._metadata = (("authorization", f"Bearer {admin_token}"),)
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def stub(self, address: str) -> agent_pb2_grpc.AgentServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_aio_channel(address, self._tls)
            self._channels[address] = channel
        return agent_pb2_grpc.AgentServiceStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
