"""Runs the Alembic migrations in `migrations/` against a database URL."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config


def migrations_dir() -> Path:
    """`migrations/` at the repository root (or ROTA_MIGRATIONS_DIR for installed images)."""
    override = os.environ.get("ROTA_MIGRATIONS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raises when the models and the migrated schema differ."""
    command.check(alembic_config(url))
