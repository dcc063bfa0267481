"""Composition root of the web console: an HTTP server over one gRPC channel to the api.

Why this stack: the console is read-mostly pages for operators and tenants on machines that
may have no internet, so it is server-rendered HTML (Jinja2, autoescaped) with one small
CSS file and one small vanilla script (polling two JSON endpoints), all served by this
process: no build step, no npm tree, no CDN, nothing to download in a browser. The
standard library's ThreadingHTTPServer serves it: each request is a few blocking SDK calls
with a deadline, and a thread per request is the simplest correct way to run those.

It is a client of the api, not of the database: every page is SDK calls (`rota.client`)
with the caller's own token, so what a tenant sees is what the api shows that tenant (the
import-linter contract "The console is a client of the api" in pyproject.toml keeps it so).

Configured like every service (ROTA_* variables, which `rota up` sets):
  ROTA_LISTEN            where it serves HTTP (host:port; port 0: a free one, logged)
  ROTA_API_ADDR          the api's public endpoint
  ROTA_TLS_CA/CERT/KEY   mutual TLS to the api (all three, or none); ROTA_TLS_SERVER_NAME
                         the name the api's certificate carries, when not the host dialled
  ROTA_CONSOLE_DEADLINE  seconds every SDK call may take (default 5)
  ROTA_CONSOLE_CERT/KEY  serve HTTPS with this certificate (cookies then `Secure`); else HTTP
"""

from __future__ import annotations

import json
import logging
import os
import signal
import ssl
import threading
from datetime import timedelta
from http.server import ThreadingHTTPServer
from types import FrameType

import grpc

from rota.client import TLS
from rota.console.app import ConsoleApp, Handler
from rota.console.gateway import Gateway
from rota.console.views import Views

log = logging.getLogger("rota.console")

# The SDK's retry policy (rota.client.client): UNAVAILABLE only, with backoff, within the deadline.
RETRY_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": f"rota.v1.{name}"} for name in (
        "JobService", "TenantService", "ClusterService", "AllocatorService", "LedgerService",
        "ForecasterService", "CheckpointService", "DetectorService")],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"ROTA_LISTEN: host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _deadline() -> timedelta:
    raw = os.environ.get("ROTA_CONSOLE_DEADLINE", "") or "5"
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"ROTA_CONSOLE_DEADLINE: not a number: {raw!r}") from exc
    if not value > 0:
        raise ValueError(f"ROTA_CONSOLE_DEADLINE: must be positive, got {raw}")
    return timedelta(seconds=value)


def open_channel(target: str, tls: TLS | None, server_name: str = "") -> grpc.Channel:
    options: list[tuple[str, object]] = [("grpc.service_config", RETRY_CONFIG), ("grpc.enable_retries", 1)]
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, tls.credentials(), options=options)


def build_server() -> tuple[ThreadingHTTPServer, grpc.Channel, str]:
    """The HTTP server (bound, not yet serving), its channel to the api, and its URL."""
    host, port = _host_port(os.environ.get("ROTA_LISTEN", "") or "127.0.0.1:8080")
    api = os.environ.get("ROTA_API_ADDR", "") or "127.0.0.1:50051"
    channel = open_channel(api, TLS.from_env(), os.environ.get("ROTA_TLS_SERVER_NAME", "").strip())
    cert, key = os.environ.get("ROTA_CONSOLE_CERT", ""), os.environ.get("ROTA_CONSOLE_KEY", "")
    if bool(cert) != bool(key):
        raise ValueError("ROTA_CONSOLE_CERT and ROTA_CONSOLE_KEY: give both (HTTPS) or neither (HTTP)")
    app = ConsoleApp(Gateway(channel, _deadline()), Views(), secure_cookie=bool(cert))
    handler = type("ConsoleHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    if cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    bound = server.server_address[1]
    return server, channel, f"{'https' if cert else 'http'}://{host}:{bound}"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server, channel, url = build_server()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()  # shutdown() waits for serve_forever

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("console serving on %s (api %s)", url, os.environ.get("ROTA_API_ADDR", "127.0.0.1:50051"))
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        channel.close()


if __name__ == "__main__":
    main()
