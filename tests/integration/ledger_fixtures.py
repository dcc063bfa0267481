"""Rows for ledger tests: tenants, nodes, jobs and placements at chosen times, on a private database."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
from datetime import datetime
from decimal import Decimal

import grpc
from opentelemetry import trace
from sqlalchemy import update
from sqlalchemy.orm import Session

from rota.cluster.models import GpuRow, JobRow, NodeRow, PlacementRow
from rota.common.auth import hash_token
from rota.common.bootstrap import TokenAuthenticator
from rota.common.db import Database
from rota.common.models import TenantRow
from rota.common.server import RotaInterceptor
from rota.core.fairness.rates import DEFAULT_RATES, GpuRates
from rota.ledger.service import LedgerService
from rota.v1 import ledger_pb2_grpc

_epochs = itertools.count(1)
ADMIN = "admin-secret"


class LedgerServer:
    """The ledger servicer on an ephemeral port, its event loop on a thread of its own."""

    def __init__(self, db: Database, rates: GpuRates = DEFAULT_RATES, *, policy: str = "fast",
                 lease_s: float = 0.0) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> tuple[grpc.aio.Server, int]:
            interceptor = RotaInterceptor(
                tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db), default_deadline_s=20
            )
            server = grpc.aio.server(interceptors=[interceptor])
            ledger_pb2_grpc.add_LedgerServiceServicer_to_server(LedgerService(db, rates=rates, policy=policy, lease_s=lease_s),
                                                                server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port

        self.server, self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.target = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def add_tenant(
    db: Database, name: str, share: float = 1.0, created: datetime | None = None, token: str = ""
) -> str:
    def add(s: Session) -> None:
        s.add(TenantRow(name=name, share=share, token_hash=hash_token(token or secrets.token_hex(16))))
        s.flush()
        if created is not None:
            s.execute(update(TenantRow).where(TenantRow.name == name).values(created_at=created))

    db.run(add)
    return name


def add_node(
    db: Database, name: str, gpus: int, health: str = "ALIVE", at: datetime | None = None, gpu_type: str = ""
) -> str:
    def add(s: Session) -> None:
        s.add(NodeRow(name=name, address="127.0.0.1:1", health=health, last_heartbeat=at))
        s.flush()
        for i in range(gpus):
            s.add(GpuRow(node=name, index=i, uuid=f"{name}-{i}", model="virtual", virtual=True, gpu_type=gpu_type))

    db.run(add)
    return name


def add_job(
    db: Database, job_id: str, tenant: str, gpus: int, created: datetime,
    finished: datetime | None = None, state: str = "", priority: int = 5,
) -> str:
    state = state or ("SUCCEEDED" if finished else "PENDING")
    db.run(lambda s: s.add(JobRow(
        id=job_id, tenant=tenant, name=job_id, kind="training", priority=priority, gpus=gpus, spec={},
        spec_hash="-", state=state, created_at=created, finished_at=finished,
    )))
    return job_id


def add_placement(
    db: Database, job_id: str, node: str, gpu_indices: list[int], start: datetime, end: datetime | None
) -> int:
    def add(s: Session) -> int:
        p = PlacementRow(job_id=job_id, node=node, gpu_indices=gpu_indices, epoch=next(_epochs),
                         created_at=start, released_at=end)
        s.add(p)
        s.flush()
        return p.id

    return db.run(add)


def release(db: Database, placement_id: int, at: datetime) -> None:
    db.run(lambda s: s.execute(update(PlacementRow).where(PlacementRow.id == placement_id).values(released_at=at)))


def exact_seconds(start: datetime, end: datetime) -> Decimal:
    """end - start in seconds, exact to the microsecond (as Postgres keeps timestamps)."""
    micros = (end - start).days * 86_400_000_000 + (end - start).seconds * 1_000_000 + (end - start).microseconds
    return Decimal(micros) / Decimal(1_000_000)
