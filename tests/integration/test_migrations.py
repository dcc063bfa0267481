"""Alembic migrations on a real PostgreSQL: upgrade, no drift, downgrade, upgrade again."""

from __future__ import annotations

from sqlalchemy import inspect, text

import rota.allocator.models  # noqa: F401 - every service's models, as migrations/env.py loads them
import rota.checkpoint.models  # noqa: F401
import rota.detector.models  # noqa: F401
import rota.forecaster.models  # noqa: F401
import rota.ledger.models  # noqa: F401
from rota.common import migrate, read_models
from rota.common.db import make_engine
from rota.common.models import Base

metadata = Base.metadata

TABLES = {"tenants", "tenant_users", "jobs", "job_transitions", "nodes", "gpus", "placements", "gpu_claims", "gpu_guests", "plan_steps",
          "ledger_usage", "ledger_collected", "forecast_completions", "forecast_traffic",
          "job_forecasts", "checkpoint_chunks", "checkpoint_images", "checkpoint_manifests",
          "checkpoint_image_chunks", "checkpoint_operations", "detector_verdicts",
          "job_layouts", "device_health", "gang_exits", "job_arrays"}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _has_epoch_sequence(url: str) -> bool:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relkind = 'S' AND relname = 'rota_epoch_seq'")
            ).scalar_one())
    finally:
        engine.dispose()


def test_upgrade_check_downgrade_upgrade(empty_database_url: str) -> None:
    url = empty_database_url
    assert _tables(url) == set()

    migrate.upgrade(url)
    assert _tables(url) == TABLES == set(metadata.tables)
    assert _has_epoch_sequence(url)
    migrate.check(url)  # raises when the models and the migrated schema differ

    migrate.downgrade(url)
    assert _tables(url) == set()
    assert not _has_epoch_sequence(url)

    migrate.upgrade(url)
    assert _tables(url) == TABLES
    migrate.check(url)


def _views(url: str) -> dict[str, set[str]]:
    engine = make_engine(url)
    try:
        found = inspect(engine)
        return {name: {c["name"] for c in found.get_columns(name)} for name in found.get_view_names()}
    finally:
        engine.dispose()


def test_the_published_read_models_have_the_declared_columns(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    declared = {name: {c.name for c in table.columns} for name, table in read_models.VIEWS.tables.items()}
    assert _views(empty_database_url) == declared
    migrate.downgrade(empty_database_url)
    assert _views(empty_database_url) == {}


def test_upgrade_is_idempotent(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    migrate.upgrade(empty_database_url)
    migrate.check(empty_database_url)
