"""Mutual TLS on real gRPC servers: the api's services (and the ledger behind its forwarder)
started by `start_server`, what `run_server` runs, on a real PostgreSQL and Redis.

Who gets in: a client with a CA-signed certificate; not a plaintext client, not a TLS
client without a certificate, not one whose certificate another CA signed. Who it is: the
bearer token when one is sent; without one, the tenant a `tenant:NAME` certificate names
(never the admin); through the api's forwarder too.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from rota.api.forward import Forwarder
from rota.api.service import ApiContext, ClusterService, JobService, TenantService
from rota.cli.certs import LocalPKI, issue, issue_tenant, make_ca, make_local_pki
from rota.client import (
    TLS,
    Client,
    InvalidArgumentError,
    Job,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    job_spec_from_mapping,
)
from rota.common.agents import AgentClients
from rota.common.bootstrap import TokenAuthenticator
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis
from rota.common.server import RotaInterceptor, Serving, start_server
from rota.common.tls import ON_BEHALF_OF, TLSFiles, open_channel
from rota.ledger.service import LedgerService
from rota.v1 import api_pb2, api_pb2_grpc, ledger_pb2, ledger_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)
TIMEOUT = timedelta(seconds=10)


@dataclass
class Certs:
    pki: LocalPKI
    alpha: TLS
    beta: TLS
    admin_cn: TLS  # CN "admin": must not be the admin
    cli: TLS  # CN client:rota: names no tenant
    foreign: TLS  # CN tenant:alpha, signed by another CA

    @property
    def service(self) -> TLSFiles:
        return TLSFiles(cert=self.pki.service.cert, key=self.pki.service.key, ca=self.pki.ca.cert)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("pki")
    pki = make_local_pki(root / "tls")
    ca = str(pki.ca.cert)

    def sdk(cert: Path, key: Path) -> TLS:
        return TLS(ca=ca, cert=cert, key=key)

    alpha, beta = issue_tenant(pki.ca, "alpha", root), issue_tenant(pki.ca, "beta", root)
    admin = issue(pki.ca, "admin", root / "admin.pem", root / "admin.key")
    other_ca = make_ca(root / "other")
    foreign = issue(other_ca, "tenant:alpha", root / "foreign.pem", root / "foreign.key")
    return Certs(
        pki, sdk(alpha.cert, alpha.key), sdk(beta.cert, beta.key), sdk(admin.cert, admin.key),
        sdk(pki.client.cert, pki.client.key), sdk(foreign.cert, foreign.key),
    )


class Servers:
    """The api (with its forwarder to a ledger) and the ledger, both TLS, on a loop thread."""

    def __init__(self, db: Database, live: LiveState, tls: TLSFiles) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servings: list[Serving] = []
        settings = Settings(admin_token=ADMIN, redis_prefix=live.prefix)

        def interceptor() -> RotaInterceptor:
            return RotaInterceptor(
                tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db), default_deadline_s=20
            )

        async def start() -> tuple[int, int]:
            def ledger(server: grpc.aio.Server) -> list[str]:
                ledger_pb2_grpc.add_LedgerServiceServicer_to_server(LedgerService(db), server)
                return [ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"].full_name]

            behind = await start_server(
                listen="127.0.0.1:0", register=ledger, interceptor=interceptor(), max_message_bytes=1 << 22, tls=tls
            )
            self.servings.append(behind)
            self.forwarder = Forwarder({"ledger": f"127.0.0.1:{behind.port}"}, 20, tls=tls)
            ctx = ApiContext(settings, db, live, AgentClients(ADMIN, tls=tls))

            def api(server: grpc.aio.Server) -> list[str]:
                api_pb2_grpc.add_JobServiceServicer_to_server(JobService(ctx), server)
                api_pb2_grpc.add_TenantServiceServicer_to_server(TenantService(ctx), server)
                api_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterService(ctx), server)
                server.add_generic_rpc_handlers(self.forwarder.handlers())
                return [api_pb2.DESCRIPTOR.services_by_name[n].full_name for n in ("JobService", "TenantService")]

            front = await start_server(
                listen="127.0.0.1:0", register=api, interceptor=interceptor(), max_message_bytes=1 << 22, tls=tls
            )
            self.servings.append(front)
            return front.port, behind.port

        api_port, ledger_port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(20)
        self.target = f"127.0.0.1:{api_port}"
        self.ledger_target = f"127.0.0.1:{ledger_port}"

    def stop(self) -> None:
        async def stop() -> None:
            await self.forwarder.close()
            for serving in self.servings:
                await serving.server.stop(0)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers(databases: Any, redis_url: str, certs: Certs) -> Iterator[Servers]:
    with databases.migrated() as db:
        live = LiveState(connect_redis(redis_url), "rota-test:" + secrets.token_hex(4))
        running = Servers(db, live, certs.service)
        try:
            yield running
        finally:
            running.stop()
            live.client.close()


@pytest.fixture(scope="module")
def jobs(servers: Servers, certs: Certs) -> dict[str, str]:
    """Tenants alpha and beta with one job each, made by the admin over mutual TLS."""
    ids = {}
    with Client.connect(servers.target, token=ADMIN, timeout=TIMEOUT, tls=certs.cli) as admin:
        for tenant in ("alpha", "beta"):
            admin.create_tenant(tenant)
            spec = job_spec_from_mapping({"name": f"{tenant}-job", "tenant": tenant, "gpus": 1, "command": ["true"]})
            ids[tenant] = admin.submit(spec=spec).id
    return ids


def _health(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    with channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _assert_only(listed: Any, tenant: str, jobs: dict[str, str]) -> None:
    """The listing holds the tenant's job and no other tenant's."""
    listed = list(listed)
    assert {j.tenant for j in listed} == {tenant}
    assert jobs[tenant] in {j.id for j in listed}


def test_a_client_with_a_ca_signed_certificate_gets_in(servers: Servers, certs: Certs, jobs: dict[str, str]) -> None:
    with open_channel(servers.target, certs.service) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with Client.connect(servers.target, token=ADMIN, timeout=TIMEOUT, tls=certs.cli) as admin:
        assert {j.id for j in admin.list_jobs()} == set(jobs.values())


def test_a_plaintext_client_is_refused(servers: Servers) -> None:
    assert _health(servers.target, None) == grpc.StatusCode.UNAVAILABLE
    assert _health(servers.ledger_target, None) == grpc.StatusCode.UNAVAILABLE


def test_a_client_without_a_certificate_is_refused(servers: Servers, certs: Certs) -> None:
    ca_only = grpc.ssl_channel_credentials(root_certificates=certs.pki.ca.cert.read_bytes())
    assert _health(servers.target, ca_only) == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_signed_by_another_ca_is_refused(servers: Servers, certs: Certs) -> None:
    assert _health(servers.target, certs.foreign.credentials()) == grpc.StatusCode.UNAVAILABLE


def test_a_tenant_certificate_without_a_token_acts_as_that_tenant(
    servers: Servers, certs: Certs, jobs: dict[str, str]
) -> None:
    with Client.connect(servers.target, token="", timeout=TIMEOUT, tls=certs.alpha) as alpha:
        _assert_only(alpha.list_jobs(), "alpha", jobs)
        _assert_only(alpha.list_jobs(tenant="beta"), "alpha", jobs)  # the request body names no one
        assert alpha.get_job(jobs["alpha"]).tenant == "alpha"
        with pytest.raises(NotFoundError):
            alpha.get_job(jobs["beta"])
        spec = job_spec_from_mapping({"name": "mine", "gpus": 1, "command": ["true"]})
        mine = alpha.submit(spec=spec)
        assert mine.tenant == "alpha"
        with pytest.raises(InvalidArgumentError) as err:
            alpha.submit(spec=job_spec_from_mapping({"name": "theirs", "tenant": "beta", "gpus": 1, "command": ["true"]}))
        assert err.value.field == "tenant"
        with pytest.raises(PermissionDeniedError):
            alpha.create_tenant("gamma")
        alpha.cancel(mine.id)
    with Client.connect(servers.target, token="", timeout=TIMEOUT, tls=certs.beta) as beta:
        _assert_only(beta.list_jobs(), "beta", jobs)


def test_the_token_decides_when_both_are_given(servers: Servers, certs: Certs, jobs: dict[str, str]) -> None:
    with Client.connect(servers.target, token=ADMIN, timeout=TIMEOUT, tls=certs.alpha) as as_admin:
        assert jobs["beta"] in {j.id for j in as_admin.list_jobs()}
    with Client.connect(servers.target, token="wrong", timeout=TIMEOUT, tls=certs.alpha) as wrong:
        with pytest.raises(UnauthenticatedError):
            wrong.list_jobs()


@pytest.mark.parametrize("which", ["admin_cn", "cli"])
def test_a_certificate_naming_no_tenant_is_no_identity(servers: Servers, certs: Certs, which: str) -> None:
    with Client.connect(servers.target, token="", timeout=TIMEOUT, tls=getattr(certs, which)) as client:
        with pytest.raises(UnauthenticatedError):
            client.list_jobs()
        with pytest.raises(UnauthenticatedError):
            client.create_tenant("gamma")


def test_the_forwarder_carries_a_certificate_tenant_to_the_owning_service(
    servers: Servers, certs: Certs, jobs: dict[str, str]
) -> None:
    with Client.connect(servers.target, token="", timeout=TIMEOUT, tls=certs.alpha) as alpha:
        assert [t.tenant for t in alpha.standings().tenants] == ["alpha"]
    with Client.connect(servers.target, token=ADMIN, timeout=TIMEOUT, tls=certs.cli) as admin:
        assert sorted(t.tenant for t in admin.standings().tenants) == ["alpha", "beta"]


def test_only_a_service_certificate_may_name_a_tenant_in_metadata(
    servers: Servers, certs: Certs, jobs: dict[str, str]
) -> None:
    request = api_pb2.ListJobsRequest()
    claim = ((ON_BEHALF_OF, "tenant:beta"),)
    with open_channel(servers.target, certs.service) as channel:
        reply = api_pb2_grpc.JobServiceStub(channel).ListJobs(request, timeout=5, metadata=claim)
        _assert_only(map(Job._from_proto, reply.jobs), "beta", jobs)
    with grpc.secure_channel(servers.target, certs.cli.credentials()) as channel:
        with pytest.raises(grpc.RpcError) as err:
            api_pb2_grpc.JobServiceStub(channel).ListJobs(request, timeout=5, metadata=claim)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.secure_channel(servers.target, certs.alpha.credentials()) as channel:
        reply = api_pb2_grpc.JobServiceStub(channel).ListJobs(request, timeout=5, metadata=claim)
        _assert_only(map(Job._from_proto, reply.jobs), "alpha", jobs)
