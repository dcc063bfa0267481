"""Tenants' quotas and users through the api (TenantService, JobService) on a real PostgreSQL
and Redis, with the SDK: quotas validated naming the field, users with their own tokens
(hashed at rest, listed with last use), a revoked token refused at once, jobs that record
their user, `mine`, and a plain user who may cancel only its own jobs."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from sqlalchemy import text

from rota.api.service import ApiContext, JobService, TenantService
from rota.client import (
    Client,
    InvalidArgumentError,
    JobSpec,
    PermissionDeniedError,
    UnauthenticatedError,
)
from rota.common.agents import AgentClients
from rota.common.auth import hash_token
from rota.common.bootstrap import TokenAuthenticator
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis
from rota.common.server import RotaInterceptor, Serving, start_server
from rota.v1 import api_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)


class Api:
    """The api's TenantService and JobService on one plaintext port, on a loop thread."""

    def __init__(self, db: Database, live: LiveState) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        ctx = ApiContext(Settings(admin_token=ADMIN, redis_prefix=live.prefix), db, live, AgentClients(ADMIN))

        def register(server: grpc.aio.Server) -> list[str]:
            api_pb2_grpc.add_TenantServiceServicer_to_server(TenantService(ctx), server)
            api_pb2_grpc.add_JobServiceServicer_to_server(JobService(ctx), server)
            return []

        async def start() -> Serving:
            interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db),
                                          default_deadline_s=20)
            return await start_server(listen="127.0.0.1:0", register=register, interceptor=interceptor,
                                      max_message_bytes=1 << 22)

        self.serving = asyncio.run_coroutine_threadsafe(start(), self.loop).result(20)
        self.target = f"127.0.0.1:{self.serving.port}"
        self.db = db

    def client(self, token: str) -> Client:
        return Client.connect(self.target, token=token)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.serving.server.stop(0), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def api(databases: Any, redis_url: str) -> Iterator[Api]:
    with databases.migrated() as db:
        live = LiveState(connect_redis(redis_url), "rota-test:" + secrets.token_hex(4))
        running = Api(db, live)
        try:
            yield running
        finally:
            running.stop()
            live.client.close()


def name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"guaranteed": -1}, "guaranteed"),
    ({"limit": -3}, "limit"),
    ({"guaranteed": 8, "limit": 4}, "limit"),
    ({"parent": "no-such-tenant"}, "parent"),
    ({"gpu_limits": {"a100": -1}}, "gpu_limits[a100]"),
])
def test_bad_quotas_are_refused_naming_the_field_and_nothing_is_stored(api: Api, kwargs: dict[str, Any],
                                                                        field: str) -> None:
    with api.client(ADMIN) as admin:
        tenant = name("bad")
        with pytest.raises(InvalidArgumentError) as caught:
            admin.create_tenant(tenant, **kwargs)
        assert caught.value.field == field
        assert tenant not in {t.name for t in admin.list_tenants()}


def test_a_cycle_in_the_tenant_tree_is_refused(api: Api) -> None:
    dept, group = name("dept"), name("group")
    with api.client(ADMIN) as admin:
        admin.create_tenant(dept, guaranteed=8, limit=16)
        created, _ = admin.create_tenant(group, guaranteed=4, limit=8, parent=dept)
        assert (created.guaranteed, created.limit, created.parent) == (4, 8, dept)
        with pytest.raises(InvalidArgumentError) as caught:
            admin.set_tenant_quota(dept, guaranteed=8, limit=16, parent=group)
        assert caught.value.field == "parent" and "cycle" in str(caught.value)
        listed = {t.name: t for t in admin.list_tenants()}
        assert listed[dept].parent == "" and (listed[group].in_use, listed[group].borrowed) == (0, 0)


def test_users_own_tokens_jobs_record_their_user_and_a_revoked_token_is_refused_at_once(api: Api) -> None:
    tenant = name("vision")
    with api.client(ADMIN) as admin:
        _, tenant_token = admin.create_tenant(tenant, guaranteed=2, limit=4)
    with api.client(tenant_token) as owner:
        ada, ada_token = owner.create_user("ada")
        _, bob_token = owner.create_user("bob")
        assert not ada.tenant_admin and ada.tenant == tenant
    # Only the hash is at rest.
    stored = api.db.run(lambda s: s.execute(text("SELECT token_hash FROM tenant_users WHERE tenant = :t AND name = 'ada'"),
                                            {"t": tenant}).scalar_one())
    assert stored == hash_token(ada_token) and ada_token not in stored
    spec = JobSpec(name="train", command=["python", "-c", "pass"], gpus=1)
    with api.client(ada_token) as ada_client, api.client(bob_token) as bob_client:
        job = ada_client.submit(spec=spec)
        bob_job = bob_client.submit(spec=spec)
        assert ada_client.get_job(job.id).user == "ada"
        assert [j.id for j in ada_client.list_jobs(mine=True)] == [job.id]
        assert {j.id for j in ada_client.list_jobs()} == {job.id, bob_job.id}  # the tenant's jobs
        with pytest.raises(PermissionDeniedError):
            ada_client.cancel(bob_job.id)  # a plain user cancels only its own
        with pytest.raises(PermissionDeniedError):
            ada_client.create_user("eve")  # and manages no users
        with api.client(tenant_token) as owner:
            assert owner.revoke_user("ada").revoked
            listed = {u.name: u for u in owner.list_users()}
        assert listed["ada"].revoked and listed["bob"].last_used_at is not None
        with pytest.raises(UnauthenticatedError):
            ada_client.list_jobs()  # the very next call, no cache to wait out
        assert bob_client.get_job(bob_job.id).user == "bob"


def test_mine_needs_a_user_token_and_a_tenant_admin_manages_its_tenant_only(api: Api) -> None:
    tenant, other = name("nlp"), name("audio")
    with api.client(ADMIN) as admin:
        _, tenant_token = admin.create_tenant(tenant)
        admin.create_tenant(other)
        lead, lead_token = admin.create_user("lead", tenant=tenant, tenant_admin=True)
        assert lead.tenant_admin
    with api.client(tenant_token) as owner:
        with pytest.raises(InvalidArgumentError) as caught:
            owner.list_jobs(mine=True)
        assert caught.value.field == "mine"
    with api.client(lead_token) as lead_client:
        _, fresh = lead_client.create_user("intern")
        assert {u.name for u in lead_client.list_users()} == {"lead", "intern"}
        with pytest.raises(PermissionDeniedError):
            lead_client.create_user("spy", tenant=other)
        with pytest.raises(PermissionDeniedError):
            lead_client.set_tenant_quota(tenant, guaranteed=64, limit=64)  # quotas are the admin's
        _, newer = lead_client.issue_user_token("intern")
    with api.client(fresh) as stale, pytest.raises(UnauthenticatedError):
        stale.list_jobs()
    with api.client(newer) as intern:
        assert intern.list_jobs(mine=True) == []
