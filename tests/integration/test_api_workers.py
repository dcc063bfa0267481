"""Several processes of one service on one port (`rota up --api-workers N`): with
Settings.reuse_port the servers share the address; without it a taken port still fails
the bind, so two clusters can never share a port by accident."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from rota.common.server import RotaInterceptor, Serving, start_server


async def serve(listen: str, reuse_port: bool) -> Serving:
    interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=None, default_deadline_s=5)
    return await start_server(listen=listen, register=lambda server: [], interceptor=interceptor,
                              max_message_bytes=1 << 20, reuse_port=reuse_port)


async def healthy(target: str) -> bool:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_workers_share_a_port_only_when_asked() -> None:
    async def run() -> None:
        first = await serve("127.0.0.1:0", reuse_port=True)
        target = f"127.0.0.1:{first.port}"
        second = await serve(target, reuse_port=True)
        try:
            assert second.port == first.port
            await first.server.stop(None)  # the port keeps serving through the other worker
            assert await healthy(target)
        finally:
            await second.server.stop(None)

        alone = await serve("127.0.0.1:0", reuse_port=False)
        try:
            with pytest.raises(RuntimeError):
                await serve(f"127.0.0.1:{alone.port}", reuse_port=False)
        finally:
            await alone.server.stop(None)

    asyncio.run(run())
