"""The api as the one front door: it forwards the other services' RPCs, bytes in, bytes out.

A client (the SDK, the CLI) dials one endpoint with one token. The api authenticates the
call like any other (its interceptor runs first), then passes the request bytes, the
caller's token and trace context, and the remaining deadline to the service that owns the
RPC, and returns that service's answer or status unchanged. The owning service checks
the token again: forwarding grants nothing. A caller authenticated by a tenant client
certificate alone (mutual TLS) has no token to pass: the api names that tenant in the
`rota-on-behalf-of` header, which the owner honours only from a service certificate
(rota.common.tls). Client-streaming RPCs (agents' heartbeats to
the detector) are not forwarded: agents dial the detector directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.descriptor import FileDescriptor

from rota.common.auth import bearer, current_identity
from rota.common.config import FORWARDED_SERVICES
from rota.common.server import FIELD_TRAILER
from rota.common.tls import TLSFiles, on_behalf_of, open_aio_channel
from rota.v1 import allocator_pb2, checkpoint_pb2, detector_pb2, forecaster_pb2, ledger_pb2

SERVICES: dict[str, tuple[FileDescriptor, str]] = {
    "allocator": (allocator_pb2.DESCRIPTOR, "AllocatorService"),
    "forecaster": (forecaster_pb2.DESCRIPTOR, "ForecasterService"),
    "ledger": (ledger_pb2.DESCRIPTOR, "LedgerService"),
    "checkpoint": (checkpoint_pb2.DESCRIPTOR, "CheckpointService"),
    "detector": (detector_pb2.DESCRIPTOR, "DetectorService"),
}
assert set(SERVICES) == set(FORWARDED_SERVICES)
PASSED_METADATA = ("authorization", "traceparent", "tracestate")
PASSED_TRAILERS = (FIELD_TRAILER,)


class Forwarder:
    def __init__(self, addresses: dict[str, str], default_deadline_s: float, *, tls: TLSFiles | None = None) -> None:
        self.addresses = addresses
        self.tls = tls
        self.default_deadline_s = default_deadline_s
        self.channels: dict[str, grpc.aio.Channel] = {}

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        out: list[grpc.GenericRpcHandler] = []
        for name, address in self.addresses.items():
            descriptor, service = SERVICES[name]
            channel = self.channels[name] = open_aio_channel(address, self.tls)
            full = descriptor.services_by_name[service].full_name
            methods: dict[str, grpc.RpcMethodHandler] = {}
            for method in descriptor.services_by_name[service].methods:
                path = f"/{full}/{method.name}"
                if method.client_streaming:
                    continue
                if method.server_streaming:
                    methods[method.name] = grpc.unary_stream_rpc_method_handler(self._stream(channel, path))
                else:
                    methods[method.name] = grpc.unary_unary_rpc_method_handler(self._unary(channel, path))
            out.append(grpc.method_handlers_generic_handler(full, methods))
        return out

    def services(self) -> list[tuple[FileDescriptor, str]]:
        """The forwarded services (file, service name): those with an address."""
        return [SERVICES[name] for name in self.addresses]

    def _call_options(self, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        metadata = tuple((k, v) for k, v in context.invocation_metadata() or () if k in PASSED_METADATA)
        if self.tls is not None and not bearer(metadata):
            metadata += on_behalf_of(current_identity())  # authenticated here by its certificate
        remaining = context.time_remaining()
        return {"metadata": metadata, "timeout": remaining if remaining is not None else self.default_deadline_s}

    def _unary(self, channel: grpc.aio.Channel, path: str) -> Any:
        call = channel.unary_unary(path, None, None)  # no (de)serializers: bytes pass through

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await call(request, **self._call_options(context))  # type: ignore[no-any-return]
            except grpc.aio.AioRpcError as exc:
                await _relay(exc, context)
                raise

        return forward

    def _stream(self, channel: grpc.aio.Channel, path: str) -> Any:
        call = channel.unary_stream(path, None, None)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            try:
                async for item in call(request, **self._call_options(context)):
                    yield item
            except grpc.aio.AioRpcError as exc:
                await _relay(exc, context)
                raise

        return forward

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close(None)


async def _relay(exc: grpc.aio.AioRpcError, context: grpc.aio.ServicerContext) -> None:
    """The owning service's status, details and field trailer, as if it had answered."""
    received: Any = exc.trailing_metadata() or ()
    trailers = tuple((k, v) for k, v in received if k in PASSED_TRAILERS)
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(exc.code(), exc.details() or "")
