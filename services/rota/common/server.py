"""gRPC server bootstrap shared by every service's `main.py`.

One interceptor wraps each handler in four steps: (1) continue the caller's trace and
open a span, (2) authenticate the bearer token (or, without one, a verified client
certificate naming a tenant: rota.common.tls) into an `Identity`, (3) bound the call by
its deadline (or the default one), (4) map domain and database errors to status codes,
so no traceback ever reaches a client and a database outage reads UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import propagate, trace
from sqlalchemy.exc import DataError, DBAPIError, OperationalError

from rota.common import metrics
from rota.common.auth import Identity, bearer, set_identity
from rota.common.tls import TLSFiles, bind, certificate_identity
from rota.common.wire import reject_nul
from rota.core.errors import DomainError, Unauthenticated, Unavailable

log = logging.getLogger(__name__)

Authenticator = Callable[[str], Awaitable[Identity | None]]


def _status(code_name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code_name)  # type: ignore[no-any-return]


# The trailer that names a refused request's bad field (the SDK reads it: rota.client.errors).
FIELD_TRAILER = "rota-field"


async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, DomainError):
        if exc.field:
            # Metadata values must be printable ASCII; a field path may carry a caller's map key.
            field = "".join(c if " " <= c <= "~" else "?" for c in exc.field)[:256]
            context.set_trailing_metadata(((FIELD_TRAILER, field),))
        await context.abort(_status(exc.code_name), str(exc))
    if isinstance(exc, OperationalError | Unavailable) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"dependency unavailable: {exc}")
    if isinstance(exc, DataError):
        # A value the schema cannot hold that no handler check caught (too long, out of
        # range): the caller's input, not a crash. Handlers name fields; this is the net.
        context.set_trailing_metadata(((FIELD_TRAILER, "request"),))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: a value is out of range ({exc.orig})")
    if isinstance(exc, NotImplementedError):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: not implemented yet")
    if isinstance(exc, asyncio.TimeoutError):
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: deadline exceeded")
    if _is_redis_error(exc):
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"live state unavailable: {exc}")
    log.exception("unexpected error in %s", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error ({type(exc).__name__})")


def _is_redis_error(exc: BaseException) -> bool:
    import redis

    return isinstance(exc, redis.RedisError)


class RotaInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        authenticate: Authenticator | None,
        default_deadline_s: float,
        traced: bool = True,
    ) -> None:
        self._tracer = tracer
        # Without an exporter a span records nothing, and no outgoing call injects the
        # context (the forwarder passes the caller's traceparent on as metadata): opening
        # one per call would be pure cost.
        self._traced = traced
        self._authenticate = authenticate
        self._default_deadline_s = default_deadline_s
        # The wrapped handler of each method, made on its first call: building it (and its
        # closure) again for every call cost as much as a small handler's own work. One
        # server's: shared, a method served by one server would be answered by every other.
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def for_another_server(self) -> RotaInterceptor:
        """The same checks for a second server, with a handler cache of its own."""
        return RotaInterceptor(tracer=self._tracer, authenticate=self._authenticate,
                               default_deadline_s=self._default_deadline_s, traced=self._traced)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = await continuation(details)
            if handler is None:
                return None
            wrapped = self._wrapped[method] = self._wrap(method, handler)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if method.startswith("/grpc.health") or method.startswith("/grpc.reflection"):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(method, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _enter(self, context: grpc.aio.ServicerContext) -> None:
        if self._authenticate is None:
            return
        token = bearer(tuple(context.invocation_metadata() or ()))  # type: ignore[arg-type]
        if not token:
            # Mutual TLS: a client certificate naming a tenant stands in for its token.
            from_certificate = certificate_identity(context)
            if from_certificate is None:
                raise Unauthenticated("missing bearer token (authorization metadata)")
            set_identity(from_certificate)
            return
        identity = await self._authenticate(token)
        if identity is None:
            raise Unauthenticated("unknown or revoked token")
        set_identity(identity)

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return self._default_deadline_s
        return max(0.001, min(remaining, self._default_deadline_s))

    def _span(self, method: str, context: grpc.aio.ServicerContext) -> Any:
        if not self._traced:
            return nullcontext()
        carrier = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        parent = propagate.extract(carrier)
        return self._tracer.start_as_current_span(method, context=parent, kind=trace.SpanKind.SERVER)

    def _wrap_unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        counted = _RpcMetrics(method)

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            with self._span(method, context):
                try:
                    await self._enter(context)
                    reject_nul(request)
                    # asyncio.timeout, not wait_for: no extra task (and loop hop) per call.
                    async with asyncio.timeout(self._timeout(context)):
                        return await behavior(request, context)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except BaseException as exc:  # noqa: BLE001 - every error gets a status code
                    await _abort_for(exc, context, method)
                finally:
                    counted.done(context, started)

        return wrapped

    def _wrap_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
        counted = _RpcMetrics(method)

        # Streams (watch, logs, heartbeats) live as long as the client's own deadline.
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            with self._span(method, context):
                try:
                    await self._enter(context)
                    reject_nul(request)
                    async for item in behavior(request, context):
                        yield item
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except BaseException as exc:  # noqa: BLE001
                    await _abort_for(exc, context, method)
                finally:
                    counted.done(context, started)

        return wrapped


class _RpcMetrics:
    """One method's RPC count (by status code) and latency: children bound once per method,
    since a label lookup per call would cost a small handler a noticeable share."""

    def __init__(self, method: str) -> None:
        self.service, self.method = metrics.split_method(method)
        self.seconds = metrics.RPC_SECONDS.labels(grpc_service=self.service, grpc_method=self.method)
        self.ok = metrics.RPC_HANDLED.labels(grpc_service=self.service, grpc_method=self.method, grpc_code="OK")

    def done(self, context: grpc.aio.ServicerContext, started: float) -> None:
        self.seconds.observe(time.perf_counter() - started)
        code = context.code()
        if code is None or code == grpc.StatusCode.OK or code == 0:
            self.ok.inc()
            return
        name = code.name if isinstance(code, grpc.StatusCode) else _code_name(code)
        metrics.RPC_HANDLED.labels(grpc_service=self.service, grpc_method=self.method, grpc_code=name).inc()


def _code_name(value: Any) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return str(code.name)
    return "UNKNOWN"


def server_options(max_message_bytes: int, reuse_port: bool = False) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Off unless asked for: a port already taken must fail the bind, not be shared by
        # accident; on for the worker processes of one service (Settings.reuse_port).
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]


@dataclass
class Serving:
    server: grpc.aio.Server
    health: Any
    service_names: list[str]
    port: int


async def start_server(
    *,
    listen: str,
    register: Callable[[grpc.aio.Server], list[str]],
    interceptor: RotaInterceptor,
    max_message_bytes: int,
    tls: TLSFiles | None = None,
    reuse_port: bool = False,
) -> Serving:
    """A started server: the services `register` adds, health, reflection, one port
    (mutual TLS only when `tls` is given), every service SERVING."""
    server = grpc.aio.server(interceptors=[interceptor], options=server_options(max_message_bytes, reuse_port))  # type: ignore[attr-defined]
    service_names = register(server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = bind(server, listen, tls)
    await server.start()
    for service in ["", *service_names]:
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return Serving(server, health_servicer, service_names, port)


class BackgroundTaskCrashed(RuntimeError):
    """A supervised background task died: the service stopped instead of serving without it."""


async def _start_internal(
    name: str, serving: Serving, internal: tuple[str, Callable[[grpc.aio.Server], list[str]]],
    interceptor: RotaInterceptor, max_message_bytes: int, tls: TLSFiles | None, reuse_port: bool,
) -> Serving:
    """The second port's server; if it cannot start, the first is stopped too."""
    internal_listen, register_internal = internal
    try:
        inner = await start_server(
            listen=internal_listen, register=register_internal, interceptor=interceptor.for_another_server(),
            max_message_bytes=max_message_bytes, tls=tls, reuse_port=reuse_port,
        )
    except BaseException:  # e.g. the port is taken: serve nothing rather than half
        await serving.server.stop(None)
        raise
    log.info("%s serving %s on %s (port %d)", name, ", ".join(inner.service_names), internal_listen, inner.port)
    return inner


async def _drain(servers: list[Serving], tasks: list[asyncio.Future[None]], grace_s: float) -> None:
    """Health NOT_SERVING on every server, the background tasks cancelled, then the servers drained."""
    for s in servers:
        for service in ["", *s.service_names]:
            await s.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(s.server.stop(grace_s) for s in servers))


async def run_server(
    *,
    name: str,
    listen: str,
    register: Callable[[grpc.aio.Server], list[str]],
    interceptor: RotaInterceptor,
    max_message_bytes: int,
    background: list[Callable[[], Awaitable[None]]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    grace_s: float = 5.0,
    tls: TLSFiles | None = None,
    reuse_port: bool = False,
    internal: tuple[str, Callable[[grpc.aio.Server], list[str]]] | None = None,
) -> None:
    """Serves until SIGTERM/SIGINT, then stops gracefully: health NOT_SERVING, drain, exit.

    With `tls` the port speaks mutual TLS only: plaintext clients and clients without a
    certificate signed by the CA fail the handshake. `internal` (listen, register): services
    served on a second port of their own, with the same interceptor and TLS, and never on
    `listen` (the api's NodeService, for agents only)."""
    serving = await start_server(
        listen=listen, register=register, interceptor=interceptor, max_message_bytes=max_message_bytes, tls=tls,
        reuse_port=reuse_port,
    )
    servers = [serving]
    log.info("%s serving on %s (port %d%s)", name, listen, serving.port, ", mutual TLS" if tls else "")
    if internal is not None:
        servers.append(await _start_internal(name, serving, internal, interceptor, max_message_bytes, tls, reuse_port))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Background tasks are supervised: one that dies of an exception is logged and stops the
    # service (which then exits non-zero, for its supervisor to restart it), never dies silently.
    crashed: list[str] = []

    def supervise(task: asyncio.Future[None], what: str) -> None:
        if task.cancelled() or task.exception() is None or stop.is_set():
            return
        log.error("%s: background task %s crashed; stopping the service", name, what, exc_info=task.exception())
        crashed.append(what)
        stop.set()

    tasks: list[asyncio.Future[None]] = []
    for job in background or []:
        task: asyncio.Future[None] = asyncio.ensure_future(job())
        what = str(getattr(job, "__qualname__", job))
        task.add_done_callback(functools.partial(supervise, what=what))
        tasks.append(task)
    await stop.wait()
    log.info("%s stopping", name)
    await _drain(servers, tasks, grace_s)
    if on_stop is not None:
        await on_stop()
    log.info("%s stopped", name)
    if crashed:
        raise BackgroundTaskCrashed(f"{name}: background task {', '.join(crashed)} crashed")
