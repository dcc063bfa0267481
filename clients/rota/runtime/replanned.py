"""The 3-D layout a re-plan gave this job, for a job submitted with ``accepts_layout_changes``.

When the failure detector applies a re-plan (``rota replan JOB --apply``), the job is
checkpointed and restarted from its image, and the agent passes the new layout in
``ROTA_LAYOUT`` (a JSON object). A job reads it once at start-up::

    plan = rota.runtime.layout()   # None: run with the layout you were written with
    if plan is not None:
        layers = plan["layers_per_stage"]          # replica-major, 0 for a left-out replica
        micro = plan["microbatches_per_replica"]   # the global batch, shifted to fast replicas
        groups = plan["stages"]                    # each stage's TP group by original rank
        idle = plan["idle_ranks"]                  # live ranks given no work

It also holds ``tp``, ``pp``, ``dp`` (the sizes the plan started from), ``layers``,
``microbatches`` (per replica, before the shift), ``device_speeds`` (per original rank, 0
dead), the throughputs before and after, and ``from_epoch``. Pure standard library.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["ENV_LAYOUT", "layout"]

ENV_LAYOUT = "ROTA_LAYOUT"


def layout() -> dict[str, Any] | None:
    """The re-planned layout, or None when the job runs with its own (read at call time)."""
    raw = os.environ.get(ENV_LAYOUT, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_LAYOUT} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{ENV_LAYOUT} must hold a JSON object, got {type(value).__name__}")
    return value
