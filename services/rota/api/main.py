"""Composition root of the api service: the public front door (jobs, tenants, cluster), and
the agents' NodeService on a node port of its own (Settings.node_listen)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Awaitable, Callable

import grpc

from rota.api.forward import Forwarder
from rota.api.http_gateway import HttpGateway, unary_methods
from rota.api.metrics import register_cluster_metrics
from rota.api.service import ApiContext, ClusterService, JobService, NodeService, TenantService
from rota.cluster import node_lifecycle
from rota.common.bootstrap import ServiceParts
from rota.common.config import Settings
from rota.v1 import api_pb2, api_pb2_grpc, node_pb2, node_pb2_grpc

SWITCH_INTERVAL_S = 0.0005


async def serve(settings: Settings) -> None:
    parts = ServiceParts("api", settings, pool_size=8)
    ctx = ApiContext(settings, parts.db, parts.live, parts.agents)
    register_cluster_metrics(parts.db)  # jobs, nodes and GPUs on /metrics, read at scrape time
    # Heartbeats could not arrive while the api was down: give every live node a full
    # timeout from now before the allocator may call it dead.
    await asyncio.to_thread(parts.db.run, node_lifecycle.grant_restart_grace)
    # The other services' RPCs, reachable through this one endpoint (ROTA_<SERVICE>_ADDR).
    forwarder = Forwarder(settings.service_addrs, settings.default_deadline_s, tls=parts.tls)

    def register(server: grpc.aio.Server) -> list[str]:
        api_pb2_grpc.add_JobServiceServicer_to_server(JobService(ctx), server)
        api_pb2_grpc.add_TenantServiceServicer_to_server(TenantService(ctx), server)
        api_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterService(ctx), server)
        server.add_generic_rpc_handlers(forwarder.handlers())
        names = ("JobService", "TenantService", "ClusterService")
        return [api_pb2.DESCRIPTOR.services_by_name[n].full_name for n in names]

    def register_nodes(server: grpc.aio.Server) -> list[str]:
        node_pb2_grpc.add_NodeServiceServicer_to_server(NodeService(ctx), server)
        return [node_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name]

    # Everything built so far (modules, the ORM's mappers, the engine) lives as long as the
    # process: out of the collector's sight, a full collection scans only what requests
    # made since, a millisecond's work instead of a pause of tens of milliseconds that
    # every call in flight would wait out.
    gc.freeze()
    background: list[Callable[[], Awaitable[None]]] = [http_gateway(settings, forwarder).run] if settings.http_listen else []
    await parts.serve(register, background=background, internal=(settings.node_listen, register_nodes))


def http_gateway(settings: Settings, forwarder: Forwarder) -> HttpGateway:
    """JSON over HTTP for the api's unary RPCs and the ones it forwards, passed to its own
    gRPC port (ROTA_LISTEN) on loopback."""
    if settings.tls_cert:
        raise ValueError("ROTA_HTTP_LISTEN: the JSON gateway speaks plain HTTP; not with mutual TLS")
    host, _, port = settings.listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        raise ValueError(f"ROTA_HTTP_LISTEN needs ROTA_LISTEN with a fixed port (got {settings.listen!r})")
    _, _, http_port = settings.http_listen.rpartition(":")
    if not http_port.isdigit():
        raise ValueError(f"ROTA_HTTP_LISTEN: host:port (got {settings.http_listen!r})")
    local = "127.0.0.1" if host in ("", "0.0.0.0", "[::]", "::") else host
    files = [(api_pb2.DESCRIPTOR, n) for n in ("JobService", "TenantService", "ClusterService")]
    return HttpGateway(settings.http_listen, f"{local}:{port}", unary_methods([*files, *forwarder.services()]),
                       default_deadline_s=settings.default_deadline_s, reuse_port=settings.reuse_port)


def main() -> None:
    # The event loop shares the interpreter lock with the worker threads of database
    # calls (heartbeats, reads); at the default 5 ms switch interval every call that
    # arrives while a worker runs Python waits up to 5 ms for the loop to get the lock back.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    asyncio.run(serve(Settings.from_env()))


if __name__ == "__main__":
    main()
