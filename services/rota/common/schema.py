"""Every table of every service on one metadata: what migrations are checked against.

Each service owns its tables in its own `models.py`; importing them here registers them
on the shared `Base`, so `alembic check` and the migration tests see the whole schema.
"""

from __future__ import annotations

import rota.allocator.models  # noqa: F401 - registers plan_steps
import rota.checkpoint.models  # noqa: F401 - registers checkpoint_images, _manifests, _chunks, _operations
import rota.detector.models  # noqa: F401 - registers detector_verdicts, job_layouts, device_health
import rota.forecaster.models  # noqa: F401 - registers forecast_completions, forecast_traffic
import rota.ledger.models  # noqa: F401 - registers ledger_usage, ledger_collected
from rota.common.models import Base

metadata = Base.metadata
