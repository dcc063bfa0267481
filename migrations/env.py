"""Alembic environment: the URL comes from the Config built by `rota.common.migrate`."""

from alembic import context
from sqlalchemy import create_engine, pool

# Every service owns its tables in its own models module; this environment is the one place
# that composes them all (docs/architecture.md), so `alembic check` and the migration tests
# see the whole schema while no service imports another's models.
import rota.allocator.models  # noqa: F401 - plan_steps
import rota.checkpoint.models  # noqa: F401 - checkpoint_images, _manifests, _chunks, _operations
import rota.cluster.models  # noqa: F401 - jobs, nodes, gpus, placements, gpu_claims, gpu_guests, gang_exits, ...
import rota.detector.models  # noqa: F401 - detector_verdicts, job_layouts, device_health
import rota.forecaster.models  # noqa: F401 - forecast_completions, forecast_traffic
import rota.ledger.models  # noqa: F401 - ledger_usage, ledger_collected
from rota.common.db import normalize_url
from rota.common.models import Base

metadata = Base.metadata

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
