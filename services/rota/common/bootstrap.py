"""What every service's composition root builds the same way: config, engine, Redis,
tracing, the token authenticator and the interceptor; then it serves until SIGTERM."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import grpc
from sqlalchemy import select
from sqlalchemy.orm import Session

from rota.common.agents import AgentClients
from rota.common.auth import ADMIN, TENANT, USER_TOKEN_PREFIX, Identity, hash_token
from rota.common.config import Settings
from rota.common.db import Database, make_engine
from rota.common.live import LiveState, connect_redis
from rota.common.metrics import serve_metrics
from rota.common.models import TenantRow, TenantUserRow
from rota.common.refresh import RefreshAhead
from rota.common.server import RotaInterceptor, run_server
from rota.common.telemetry import setup_logging, setup_tracing, shutdown_tracing
from rota.common.tls import tls_files
from rota.core.errors import Unauthenticated

TOKEN_CACHE_S = 5.0
LAST_USE_EVERY_S = 60.0  # a user's last use is written at most this often per process


class TokenAuthenticator:
    """Admin token from config; tenant tokens by hash from Postgres, cached briefly
    (a replaced token stops working within TOKEN_CACHE_S) and refreshed ahead of expiry.
    A token past its expiry time is refused at once, cached or not. A user's token (prefix
    `ru_`) is read on every call, uncached: a revoked one is refused by the next call."""

    def __init__(self, admin_token: str, db: Database) -> None:
        self._admin_token = admin_token
        self._db = db
        self._tenants: RefreshAhead[str, tuple[str, datetime | None] | None] = RefreshAhead(self._lookup, TOKEN_CACHE_S)
        self._used: dict[str, float] = {}  # token hash -> monotonic time its last use was written

    async def __call__(self, token: str) -> Identity | None:
        if hmac.compare_digest(token.encode(), self._admin_token.encode()):
            return Identity(ADMIN)
        if token.startswith(USER_TOKEN_PREFIX + "_"):
            return await self._user(hash_token(token))
        found = await self._tenants.get(hash_token(token))
        if found is None:
            return None
        name, expires_at = found
        if expires_at is not None and datetime.now(UTC) >= expires_at:
            raise Unauthenticated(f"token expired at {expires_at.isoformat(timespec='seconds')}")
        return Identity(TENANT, name)

    async def _lookup(self, digest: str) -> tuple[str, datetime | None] | None:
        stmt = select(TenantRow.name, TenantRow.token_expires_at).where(TenantRow.token_hash == digest)

        def read(session: Session) -> tuple[str, datetime | None] | None:
            row = session.execute(stmt).first()
            return None if row is None else (row[0], row[1])

        return await asyncio.to_thread(self._db.run, read)

    async def _user(self, digest: str) -> Identity | None:
        now = time.monotonic()
        touch = now - self._used.get(digest, float("-inf")) >= LAST_USE_EVERY_S
        stmt = select(TenantUserRow).where(TenantUserRow.token_hash == digest)

        def read(session: Session) -> tuple[str, str, bool, datetime | None] | None:
            row = session.scalars(stmt).first()
            if row is None:
                return None
            if touch:
                row.last_used_at = datetime.now(UTC)
            return row.tenant, row.name, row.tenant_admin, row.token_expires_at

        found = await asyncio.to_thread(self._db.run, read)
        if found is None:
            return None
        if touch:
            self._used[digest] = now
        tenant, user, tenant_admin, expires_at = found
        if expires_at is not None and datetime.now(UTC) >= expires_at:
            raise Unauthenticated(f"token expired at {expires_at.isoformat(timespec='seconds')}")
        return Identity(TENANT, tenant, user=user, tenant_admin=tenant_admin)


class ServiceParts:
    def __init__(self, name: str, settings: Settings, *, pool_size: int = 5) -> None:
        settings.require("database_url", "redis_url", "admin_token")
        setup_logging(name, settings.log_format)
        self.name = name
        self.settings = settings
        self.tracer = setup_tracing(name, settings.tracing, settings.otlp_endpoint)
        self.metrics_port = serve_metrics(settings.metrics_listen, name)
        self.db = Database(make_engine(settings.database_url, pool_size=pool_size, name=f"rota-{name}"))
        self.live = LiveState(connect_redis(settings.redis_url), settings.redis_prefix)
        self.tls = tls_files(settings)
        self.agents = AgentClients(settings.admin_token, tls=self.tls)

    async def serve(
        self,
        register: Callable[[grpc.aio.Server], list[str]],
        background: list[Callable[[], Awaitable[None]]] | None = None,
        internal: tuple[str, Callable[[grpc.aio.Server], list[str]]] | None = None,
    ) -> None:
        async def on_stop() -> None:
            await self.agents.close()
            self.db.engine.dispose()
            self.live.client.close()
            shutdown_tracing()

        await run_server(
            name=self.name,
            listen=self.settings.listen,
            register=register,
            interceptor=RotaInterceptor(
                tracer=self.tracer,
                authenticate=TokenAuthenticator(self.settings.admin_token, self.db),
                default_deadline_s=self.settings.default_deadline_s,
                traced=self.settings.traced,
            ),
            max_message_bytes=self.settings.max_message_bytes,
            background=background,
            on_stop=on_stop,
            tls=self.tls,
            reuse_port=self.settings.reuse_port,
            internal=internal,
        )
