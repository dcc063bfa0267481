"""A service's internal port (the api's NodeService): what one server registers, only that
server answers, although both run the same checks. The interceptor caches each method's
wrapped handler; one cache shared by two servers would let the public one answer a method
only the internal one registered."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from opentelemetry import trace

from rota.common.auth import ADMIN, Identity
from rota.common.server import RotaInterceptor, start_server

METHOD = "/rota.test.Internal/Echo"


def _internal(server: grpc.aio.Server) -> list[str]:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("rota.test.Internal", {"Echo": handler}),))
    return ["rota.test.Internal"]


async def _admin(token: str) -> Identity | None:
    return Identity(ADMIN) if token == "t" else None


async def _call(port: int) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD, None, None)
        try:
            return await call(b"ping", timeout=5, metadata=(("authorization", "Bearer t"),))
        except grpc.aio.AioRpcError as exc:
            return exc.code()


def test_a_method_of_the_internal_server_is_never_answered_by_the_public_one() -> None:
    async def scenario() -> tuple[Any, Any, Any]:
        public_checks = RotaInterceptor(tracer=trace.get_tracer("t"), authenticate=_admin, default_deadline_s=5, traced=False)
        internal_checks = public_checks.for_another_server()  # one cache each (see above)
        public = await start_server(listen="127.0.0.1:0", register=lambda s: [], interceptor=public_checks,
                                    max_message_bytes=1 << 20)
        internal = await start_server(listen="127.0.0.1:0", register=_internal, interceptor=internal_checks,
                                      max_message_bytes=1 << 20)
        try:
            # The internal server answers first (and caches its handler), then the public one is asked.
            return await _call(internal.port), await _call(public.port), await _call(internal.port)
        finally:
            await public.server.stop(None)
            await internal.server.stop(None)

    on_internal, on_public, again = asyncio.run(scenario())
    assert on_internal == b"ping" and again == b"ping"
    assert on_public == grpc.StatusCode.UNIMPLEMENTED
