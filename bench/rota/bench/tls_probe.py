"""The TLS security cases of `rota bench faults`: a throwaway server started the way every
service starts (`start_server` with mutual TLS, a local CA) and called by clients that
must be refused: one speaking plaintext, one with TLS but no client certificate."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from rota.cli.certs import make_local_pki
from rota.common.server import RotaInterceptor, Serving, start_server
from rota.common.tls import TLSFiles, open_channel


def _check(channel: grpc.Channel) -> str:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


@contextmanager
def health_only_server(tls: TLSFiles | None) -> Iterator[tuple[str, Serving, asyncio.AbstractEventLoop]]:
    """A server with nothing but health and reflection, started the way every service
    starts, on an event loop thread of its own: (its address, what started, that loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    interceptor = RotaInterceptor(tracer=trace.get_tracer("rota.bench"), authenticate=None, default_deadline_s=10)
    serving = asyncio.run_coroutine_threadsafe(start_server(
        listen="127.0.0.1:0", register=lambda _server: [], interceptor=interceptor,
        max_message_bytes=1 << 20, tls=tls,
    ), loop).result(30)
    try:
        yield f"127.0.0.1:{serving.port}", serving, loop
    finally:
        asyncio.run_coroutine_threadsafe(serving.server.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def tls_cases() -> dict[str, dict[str, Any]]:
    """{case: {expected, got, ok}} for plaintext and certificate-less clients of a TLS port."""
    with tempfile.TemporaryDirectory(prefix="rota-tls-probe-") as tmp:
        pki = make_local_pki(Path(tmp) / "tls")
        tls = TLSFiles(cert=pki.service.cert, key=pki.service.key, ca=pki.ca.cert)
        with health_only_server(tls) as (target, _serving, _loop):
            ca_only = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
            with grpc.insecure_channel(target) as plain, grpc.secure_channel(target, ca_only) as no_cert, \
                    open_channel(target, TLSFiles(cert=pki.client.cert, key=pki.client.key, ca=pki.ca.cert)) as good:
                got = {"plaintext_against_tls": _check(plain), "tls_without_client_certificate": _check(no_cert),
                       "tls_with_client_certificate": _check(good)}
    expected = {"plaintext_against_tls": "UNAVAILABLE", "tls_without_client_certificate": "UNAVAILABLE",
                "tls_with_client_certificate": "OK"}
    return {name: {"expected": want, "got": got[name], "ok": got[name] == want} for name, want in expected.items()}
