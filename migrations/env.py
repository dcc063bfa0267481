"""Alembic environment: the URL comes from the Config built by `rota.common.migrate`."""

from alembic import context
from sqlalchemy import create_engine, pool

from rota.common.db import normalize_url
from rota.common.schema import metadata

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    url = normalize_url(config.get_main_option("sqlalchemy.url") or "")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
