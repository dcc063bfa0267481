"""Builders for the api's submission tests: a fresh tenant on a real database, and a
validated job spec with chosen fields."""

from __future__ import annotations

import secrets
from typing import Any

from rota.api import repository as api
from rota.common.db import Database
from rota.core.jobspec import JobSpecData, validate


def new_tenant(db: Database) -> str:
    name = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, name, 1.0, secrets.token_hex(32)))
    return name


def job_spec(tenant: str, name: str = "job", **overrides: Any) -> JobSpecData:
    data = JobSpecData(name=name, tenant=tenant, kind="training", priority=5, gpus=1, command=["true"])
    for key, value in overrides.items():
        setattr(data, key, value)
    return validate(data, max_gpus_per_node=0)
