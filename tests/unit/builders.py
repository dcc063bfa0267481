"""Builders shared by the unit tests: the jobs the planners see, written once.

A test names what matters to it (`gpus=2`, `priority=9`) and takes the defaults for the
rest; tests/unit/conftest.py puts this folder on `sys.path`, so any unit test can
`from builders import ...`. (A module of another test folder must not also be called
`builders`: pytest imports both as one top-level module.)
"""

from __future__ import annotations

from typing import Any

from rota.core.planning.liveplan import LiveJob
from rota.core.planning.scenario import Scenario, from_dict

# Scenarios (rota.core.planning.scenario): the planners' input as its JSON form. ------------

def batch_job(id: str, *, gpus: int = 1, duration: int = 1, **fields: Any) -> dict[str, Any]:
    """A training job of a scenario: `gpus` for `duration` steps; `tenant`, `priority`,
    `arrival`, `running` and the like as given, else the scenario's defaults."""
    return {"id": id, "kind": "training", "gpus": gpus, "duration": duration, **fields}


def realtime_app(id: str, demand: list[int], *, swap: int = 8, **fields: Any) -> dict[str, Any]:
    """A realtime app of a scenario: `demand[t]` GPUs at step t, at most `swap` moved per step."""
    return {"id": id, "kind": "realtime", "demand": demand, "max_swap": swap, **fields}


def scenario(*jobs: dict[str, Any], gpus: int = 4, horizon: int = 6, name: str = "t") -> Scenario:
    return from_dict({"name": name, "gpus": gpus, "horizon": horizon, "jobs": list(jobs)})


# The live cluster (rota.core.planning.liveplan): jobs as the allocator reads them. ------

def queued(id: str, *, gpus: int = 1, minutes: float | None = 1, priority: int = 5, tenant: str = "t",
           kind: str = "training", **fields: Any) -> LiveJob:
    """A job waiting for GPUs, declared to run `minutes` (None: unknown)."""
    return LiveJob(id, tenant, kind, priority, gpus, duration_s=None if minutes is None else minutes * 60, **fields)


def running(id: str, node: str, gpus: tuple[int, ...], minutes_left: float | None = 10, *,
            elapsed_min: float = 1, priority: int = 5, preemptible: bool = False, tenant: str = "t") -> LiveJob:
    """A training job holding `gpus` of `node` for `elapsed_min`, with `minutes_left` to run
    (None: unknown; negative: over its declared time)."""
    total = None if minutes_left is None else (elapsed_min + minutes_left) * 60
    return LiveJob(id, tenant, "training", priority, len(gpus), node=node, gpu_indices=gpus,
                   elapsed_s=elapsed_min * 60, duration_s=total, preemptible=preemptible)
