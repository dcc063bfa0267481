"""Policy registry: name -> plan(scenario). `full` is loaded on first use (it imports ortools)."""

from __future__ import annotations

from collections.abc import Callable

from rota.core.planning import policy_fair, policy_fast, policy_fifo
from rota.core.planning.grid import Plan
from rota.core.planning.scenario import Scenario

Policy = Callable[[Scenario], Plan]
NAMES = ("fifo", "fast", "full", "fair")


def get(name: str, full_time_limit: float = 2.0) -> Policy:
    if name == "fifo":
        return policy_fifo.plan
    if name == "fast":
        return policy_fast.plan
    if name == "fair":  # without the ledger's standings: every tenant level
        return policy_fair.plan
    if name == "full":
        from rota.core.planning import policy_full

        return lambda s: policy_full.plan(s, time_limit=full_time_limit)
    raise KeyError(f"unknown policy {name!r}; one of {', '.join(NAMES)}")
