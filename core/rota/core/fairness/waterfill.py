"""Weighted max-min (water-filling) shares: the second reading of a tenant's deserved GPUs.

ASTRAEA's deserved share is min(demand_u, Q_u), a fixed quota capped by demand: GPUs that a
tenant leaves idle are nobody's due. The water-filling reading hands them on: each instant,
the capacity is split in proportion to the shares among tenants with demand, a tenant asking
less than its part gets exactly what it asks, and the rest is split again among the others,
until every tenant is either satisfied or at the common level. Σ deserved = min(G, Σ demand).
"""

from __future__ import annotations

from collections.abc import Mapping


def waterfill(capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's weighted max-min share of `capacity` given its demand (0 without demand).

    A tenant with demand but weight 0 gets nothing until every weighted tenant is satisfied,
    then shares what is left equally (so its deserved time is never silently dropped)."""
    out = {t: 0.0 for t in demands}
    left = float(capacity)
    for tier in (lambda t: weights.get(t, 0.0), lambda t: 1.0):
        open_ = {t for t, d in demands.items() if d > out[t] and tier(t) > 0}
        while open_ and left > 1e-12:
            level = left / sum(tier(t) for t in open_)  # GPUs per unit of weight this round
            full = {t for t in open_ if demands[t] - out[t] <= level * tier(t)}
            if not full:
                for t in open_:
                    out[t] += level * tier(t)
                left = 0.0
                break
            for t in full:  # satisfied: take exactly what is asked, hand the rest on
                left -= demands[t] - out[t]
                out[t] = float(demands[t])
            open_ -= full
    return out
