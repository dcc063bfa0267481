"""Small builders for the allocator's integration tests: a tenant and a node, a job."""

from __future__ import annotations

import secrets
from typing import Any

from rota.api import repository as api
from rota.cluster import node_lifecycle, submissions
from rota.cluster.job_lifecycle import Events
from rota.cluster.models import GpuRow
from rota.common.db import Database
from rota.core.jobspec import JobSpecData, validate


def setup_cluster(db: Database, gpus: int = 4, address: str = "127.0.0.1:1") -> tuple[str, str]:
    tenant, node = "t-" + secrets.token_hex(3), "n-" + secrets.token_hex(3)
    db.run(lambda s: api.create_tenant(s, tenant, 1.0, secrets.token_hex(32)))
    rows = [GpuRow(node=node, index=i, uuid=f"{node}-{i}", model="virtual", virtual=True) for i in range(gpus)]
    db.run(lambda s: node_lifecycle.register(s, node, address, rows))
    return tenant, node


def submit(db: Database, tenant: str, **fields: Any) -> str:
    spec = JobSpecData(name="job", tenant=tenant, kind="training", priority=5, gpus=1, command=["true"])
    for key, value in fields.items():
        setattr(spec, key, value)
    job, _ = db.run(lambda s: submissions.submit_job(s, validate(spec, max_gpus_per_node=0), "", Events()))
    return job.id
