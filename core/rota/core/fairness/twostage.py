"""ASTRAEA's two-stage choice (docs/design.md §4): pick a tenant, then one of its jobs, repeat.

Stage 1, tenant: a tenant using under 20% of its quota goes first (lowest allocation /
quota); otherwise the lowest U_u / W_u over the window. Whoever is chosen gets its next
job that fits; its standing is then charged with that job and the choice repeats, so
tenants borrow above quota only while GPUs are left over after the others.
Stage 2, job: jobs pending for longer than the starvation threshold first, oldest first;
then ascending F_j (ties by submit time).

`tenant_walk` is the generic loop (the simulator's `drf` baseline reuses it with another
tenant key); `fair_tenant_key` and `fair_job_key` are the ASTRAEA rules.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rota.core.fairness.ltgf import FairnessConfig, ratio


@dataclass
class TenantState:
    """A tenant's standing at the start of a round, charged as the round hands out jobs."""

    name: str
    quota: int
    allocated: int  # GPUs it holds now (jobs not up for renewal)
    used: float  # U_u over the window, GPU-seconds
    entitled: float  # W_u over the window
    share: float = 1.0


@dataclass(frozen=True)
class JobView:
    """What the job stage needs to know about a candidate job."""

    id: str
    tenant: str
    gpus: int
    submit_s: float
    used: float  # U_j, GPU-seconds
    deserved: float  # D_j
    pending_since: float | None  # None while it runs (a running job cannot starve)

    @property
    def fairness(self) -> float:
        return ratio(self.used, self.deserved)


def fair_tenant_key(t: TenantState, cfg: FairnessConfig) -> tuple[int, float]:
    if t.quota > 0 and t.allocated < cfg.low_usage_frac * t.quota:
        return (0, t.allocated / t.quota)
    if t.entitled > 0:
        return (1, t.used / t.entitled)
    # No entitlement (a zero quota): served only from GPUs nobody else wants.
    return (2, t.used)


def fair_job_key(j: JobView, now: float, cfg: FairnessConfig) -> tuple[int, float, float]:
    # Starving: waiting past the threshold while still owed GPU-time (F_j < 1). A job that
    # was preempted after getting its due waits like any other: counting its wait alone
    # let it displace another borrower, which then starved in turn (on the Philly trace at
    # 384 GPUs, 4x the preemptions for a slower average JCT; bench/fairness/README.md).
    if j.pending_since is not None and now - j.pending_since >= cfg.starvation_s and j.fairness < 1.0:
        return (0, j.pending_since, j.submit_s)
    return (1, j.fairness, j.submit_s)


def may_displace(holding: int, quota: int, gpus: int) -> bool:
    """Whether a tenant's job may take a borrower's GPUs at lease expiry (a starving job
    always may): when it keeps the tenant within its quota, or when the tenant holds
    nothing and the job is wider than its whole quota, which could otherwise never
    displace anyone and would wait for the starvation threshold. A tenant that took one
    such job holds GPUs, so it cannot take a second the same way."""
    return holding + gpus <= quota or (holding == 0 and gpus > quota)


# Attained-service tiers (GPU-seconds) for the contest inside a tenant: 1 GPU-h, 10, 100,
# 1,000 (ours; the sim's `las` baseline uses the same, after Tiresias' discretised queues).
ATTAINED_TIERS_GPU_S = (3600.0, 36000.0, 360000.0, 3600000.0)


def attained_tier(used_gpu_s: float) -> int:
    """A job's attained-service tier: 0 below 1 GPU-hour, then one per decade."""
    return bisect.bisect_right(ATTAINED_TIERS_GPU_S, used_gpu_s)


def own_yields(running: Sequence[tuple[str, int, float]], waiting: Sequence[tuple[int, float]]) -> list[str]:
    """Which of a tenant's running jobs, their lease expired, yield to its own waiting jobs
    (least attained service inside a tenant): `running` as (id, GPUs, attained GPU-s),
    `waiting` as (GPUs, attained GPU-s). Running jobs yield from the highest tier down,
    each only to waiting jobs of a strictly lower tier, and only while the GPUs yielded so
    far fall short of those waiting jobs' GPUs, so a few short jobs do not evict the whole
    tenant. Without this a tenant within its quota renews its long jobs forever and its
    new jobs wait behind them, first come first served."""
    out: list[str] = []
    given = 0
    for job_id, gpus, used in sorted(running, key=lambda r: (-attained_tier(r[2]), -r[2], r[0])):
        tier = attained_tier(used)
        owed = sum(g for g, u in waiting if attained_tier(u) < tier)
        if given >= owed:
            break
        out.append(job_id)
        given += gpus
    return out


def burst_borrower(used_gpu_s: float, left_s: float, lease_s: float) -> bool:
    """Whether a waiting job may borrow GPUs that another borrower's expired lease frees
    though its own tenant is at or over its quota: it has attained less than the lowest
    tier (1 GPU-hour) and is forecast to end within one lease (`left_s`: its forecast or
    declared remaining time), so it hands them back before the lender's next expiry.
    Without it a tenant's burst of short jobs queues behind other tenants' long borrowed
    jobs for hours: on Helios at 128 GPUs, 90% of the jobs (one tenant's 1-GPU bursts)
    waited 1.1 h on average under `fair` against 0.24 h under least attained service
    (bench/fairness/README.md)."""
    return attained_tier(used_gpu_s) == 0 and left_s <= lease_s


class HasTenant(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def gpus(self) -> int: ...


J = TypeVar("J", bound=HasTenant)


def tenant_walk(
    tenants: Mapping[str, TenantState],
    jobs_of: Callable[[str], Sequence[J]],
    tenant_key: Callable[[TenantState], tuple[float, ...]],
    try_place: Callable[[J], bool],
    charge_s: float,
    done: Callable[[], bool] = lambda: False,
) -> list[J]:
    """Hand out jobs tenant by tenant among `tenants` (those with candidates).

    `jobs_of(t)` gives tenant t's candidates in job order; it is called once, when t is
    first chosen, so a round that fills few GPUs never orders most tenants' queues.
    1. Pop the tenant with the smallest key among those with candidates left.
    2. Offer its next candidates to `try_place` until one is placed (skipped ones are
       gone for this round: nothing frees GPUs mid-round).
    3. Charge the tenant: allocation += n, used += n · charge_s (the lease it just got),
       and push it back with its new key. Stop when `done()` or no tenant has candidates.
    """
    heap = [(tenant_key(state), name) for name, state in tenants.items()]
    heapq.heapify(heap)
    queues: dict[str, Sequence[J]] = {}
    cursor: dict[str, int] = {}
    placed: list[J] = []
    while heap and not done():
        _, name = heapq.heappop(heap)
        if name not in queues:
            queues[name], cursor[name] = jobs_of(name), 0
        jobs, i = queues[name], cursor[name]
        while i < len(jobs) and not try_place(jobs[i]):
            i += 1
        if i == len(jobs):
            continue
        job = jobs[i]
        placed.append(job)
        cursor[name] = i + 1
        state = tenants[name]
        state.allocated += job.gpus
        state.used += job.gpus * charge_s
        if i + 1 < len(jobs):
            heapq.heappush(heap, (tenant_key(state), name))
    return placed
