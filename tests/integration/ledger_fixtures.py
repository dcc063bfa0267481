"""Rows for ledger tests: tenants, nodes, jobs and placements at chosen times, on a private database."""

from __future__ import annotations

import itertools
import secrets
from datetime import datetime
from decimal import Decimal

from sqlalchemy import update
from sqlalchemy.orm import Session

from rota.common.auth import hash_token
from rota.common.db import Database
from rota.common.models import GpuRow, JobRow, NodeRow, PlacementRow, TenantRow

_epochs = itertools.count(1)


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


def add_node(db: Database, name: str, gpus: int, health: str = "ALIVE", at: datetime | None = None) -> str:
    def add(s: Session) -> None:
        s.add(NodeRow(name=name, address="127.0.0.1:1", health=health, last_heartbeat=at))
        s.flush()
        for i in range(gpus):
            s.add(GpuRow(node=name, index=i, uuid=f"{name}-{i}", model="virtual", virtual=True))

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
