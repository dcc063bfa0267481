"""The `fair` policy: ASTRAEA's two-stage rule (docs/design.md §4) on the docs/design.md §3 grid, and the
lease-expiry decision of which running jobs yield to an under-served tenant.

`plan` pins running jobs and serves realtime apps as `fast` does; then batch-like jobs
are handed out by `rota.core.fairness.twostage.tenant_walk`: the tenant under 20% of its quota
first, else the lowest U/W, then its starving job (oldest first) or its lowest F_j; each
taken at the earliest aligned block free for its run among the starts its placement
constraints allow, as `fast` chooses it. Every pick charges its tenant a
lease, so tenants alternate in proportion to their quotas instead of one draining its
queue first. With no standings every tenant starts level (equal shares, no usage).

Pure: plain data in, a grid out; the ledger's numbers arrive as arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rota.core.fairness.ltgf import FairnessConfig, quotas
from rota.core.fairness.twostage import (
    JobView,
    TenantState,
    attained_tier,
    burst_borrower,
    fair_job_key,
    fair_tenant_key,
    may_displace,
    own_yields,
    tenant_walk,
)
from rota.core.planning.constraints import StartMasks
from rota.core.planning.grid import Board, Plan, pinned_board
from rota.core.planning.policy_fast import earliest_block, place_realtime
from rota.core.planning.scenario import BatchJob, Scenario

ON_FAILURE = "on-failure"


def level_tenants(s: Scenario, cfg: FairnessConfig) -> dict[str, TenantState]:
    """Equal shares of the grid's GPUs, the GPUs each holds at step 0, and no usage yet."""
    names = sorted({j.tenant for j in s.batch} | {r.tenant for r in s.realtime})
    quota = quotas(s.gpus, dict.fromkeys(names, 1.0))
    held = dict.fromkeys(names, 0)
    for j in s.batch:
        if j.running is not None:
            held[j.tenant] += j.gpus
    for r in s.realtime:
        held[r.tenant] += len(r.held)
    return {t: TenantState(t, quota[t], held[t], 0.0, quota[t] * cfg.window_s) for t in names}


def fair_order(
    s: Scenario,
    b: Board,
    standings: Mapping[str, TenantState] | None = None,
    jobs: Mapping[str, JobView] | None = None,
    now: float = 0.0,
    cfg: FairnessConfig | None = None,
) -> list[BatchJob]:
    """Places the waiting batch-like jobs on `b` in two-stage order; returns them in it."""
    cfg = cfg or FairnessConfig()
    level = level_tenants(s, cfg)
    given = standings or {}
    rank = {job_id: i for i, job_id in enumerate(s.order)}
    queues: dict[str, list[BatchJob]] = {}
    for j in s.batch:
        if j.running is None and j.arrival < s.horizon:
            queues.setdefault(j.tenant, []).append(j)
    # Copies: the walk charges each pick to its tenant's state.
    tenants = {t: dataclasses.replace(given[t] if t in given else level[t]) for t in queues}

    def view(j: BatchJob) -> JobView:
        known = (jobs or {}).get(j.id)
        if known is not None:
            return known
        arrives = now + j.arrival * s.step_seconds  # unknown to the ledger: F = 1, not starving
        return JobView(j.id, j.tenant, j.gpus, arrives, 0.0, 0.0, arrives)

    def jobs_of(t: str) -> list[BatchJob]:
        return sorted(queues[t], key=lambda j: (fair_job_key(view(j), now, cfg), rank.get(j.id, len(rank))))

    masks = StartMasks(s)

    def place(j: BatchJob) -> bool:
        spot = earliest_block(b, j, 0, masks)
        if spot is None:
            return False
        start, first = spot
        b.place_block(j.id, first, j.gpus, start, start + j.duration)
        return True

    return tenant_walk(tenants, jobs_of, lambda t: fair_tenant_key(t, cfg), place, cfg.lease_s)


def plan(
    s: Scenario,
    standings: Mapping[str, TenantState] | None = None,
    now: float = 0.0,
    *,
    jobs: Mapping[str, JobView] | None = None,
    cfg: FairnessConfig | None = None,
) -> Plan:
    """The `fair` grid. `standings`: per-tenant quota, held GPUs, U and W (the ledger's
    `tenant_states`); `jobs`: per-job U_j, D_j and pending_since (its `job_views`)."""
    b = pinned_board(s)
    place_realtime(b, s.realtime, StartMasks(s))
    placed = fair_order(s, b, standings, jobs, now, cfg)
    waiting = sum(1 for j in s.batch if j.running is None)
    return Plan(b.cells, {"placed": len(placed), "unplaced": waiting - len(placed)})


# Lease expiry.
@dataclass(frozen=True)
class Lease:
    """A running job's hold on its GPUs."""

    job_id: str
    tenant: str
    gpus: int
    started: float  # when it last (re)started on these GPUs
    preemptible: bool
    restart: str  # never | on-failure
    lease_start: float | None = None  # the current lease's start, if renewed since `started`
    node: str = ""
    pausable: bool = False  # it has a checkpoint image: it can be paused and resumed, not restarted
    used: float = 0.0  # its attained service U_j, GPU-seconds (the ledger's job view)


@dataclass(frozen=True)
class Yield:
    job_id: str
    tenant: str
    gpus: int
    to_job: str
    to_tenant: str
    reason: str


def expired(lease: Lease, now: float, cfg: FairnessConfig) -> bool:
    """Up for renewal: its lease ran out and it did not restart within the delay threshold."""
    begun = lease.started if lease.lease_start is None else lease.lease_start
    return now >= begun + cfg.lease_s and now - lease.started >= cfg.delay_s


def lease_yields(
    leases: Sequence[Lease],
    waiting: Sequence[JobView],
    tenants: Mapping[str, TenantState],
    free_gpus: int,
    now: float,
    cfg: FairnessConfig | None = None,
    fits: Callable[[JobView, Sequence[Lease]], bool] | None = None,
    left_s: Mapping[str, float] | None = None,
) -> list[Yield]:
    """Which running jobs yield, at lease expiry, to an under-served tenant's waiting job.

    Only a job that is `preemptible` and can continue elsewhere (it is `pausable`: paused
    and resumed from its image; or it has restart `on-failure`: requeued and restarted),
    and whose lease expired, may yield, and only while its tenant holds more
    than its quota. A waiting job may take GPUs only if its tenant stays within quota (or
    the job is starving), so a borrower yields to an under-served tenant, never to another
    borrower. Takers come in two-stage order; the most over-quota tenant yields first, its
    longest-held lease first. A taker gets yields only if they, with the free GPUs, cover
    it (and `fits(job, leases)` agrees when given, e.g. that they lie on one node).
    Then, inside each tenant within its quota, expired leases yield to the tenant's own
    waiting jobs of a lower attained-service tier (`twostage.own_yields`, as the simulator).
    Last, short bursts (`twostage.burst_borrower` on `left_s`, each waiting job's forecast
    or declared remaining seconds; a job without one is not a burst) take, in two-stage
    order, other over-quota tenants' expired leases that have attained a higher tier,
    as the simulator's `fair` does.
    """
    cfg = cfg or FairnessConfig()
    up = [x for x in leases if x.preemptible and (x.pausable or x.restart == ON_FAILURE) and expired(x, now, cfg)]
    y = _Yields(tenants, up, free_gpus, now, cfg, fits)
    queues: dict[str, list[JobView]] = {}
    for j in waiting:
        queues.setdefault(j.tenant, []).append(j)
    walkers = {t: y.state.get(t) or TenantState(t, 0, 0, 0.0, 0.0) for t in queues}

    def jobs_of(t: str) -> list[JobView]:
        return sorted(queues[t], key=lambda j: fair_job_key(j, now, cfg))

    tenant_walk(walkers, jobs_of, lambda t: fair_tenant_key(t, cfg), y.take, cfg.lease_s)
    for t in sorted(queues):
        if y.over(t) <= 0:
            y.own(t, [j for j in jobs_of(t) if j.id not in y.taken])
    if left_s:
        bursts = {t: [j for j in jobs_of(t) if j.id not in y.taken and j.id in left_s
                      and burst_borrower(j.used, left_s[j.id], cfg.lease_s)] for t in queues}
        bursts = {t: q for t, q in bursts.items() if q}
        tenant_walk({t: walkers[t] for t in bursts}, bursts.__getitem__, lambda t: fair_tenant_key(t, cfg),
                    y.take_burst, cfg.lease_s)
    return list(y.yielded.values())


class _Yields:
    """`lease_yields`' walk: what each tenant holds as takers are served, and who yielded."""

    def __init__(self, tenants: Mapping[str, TenantState], up: list[Lease], free: int, now: float,
                 cfg: FairnessConfig, fits: Callable[[JobView, Sequence[Lease]], bool] | None) -> None:
        self.state = {t: dataclasses.replace(st) for t, st in tenants.items()}
        self.holding = {t: st.allocated for t, st in tenants.items()}
        self.quota = {t: st.quota for t, st in tenants.items()}
        self.up, self.free, self.now, self.cfg, self.fits = up, free, now, cfg, fits
        self.yielded: dict[str, Yield] = {}
        self.taken: set[str] = set()

    def over(self, tenant: str) -> int:
        return self.holding.get(tenant, 0) - self.quota.get(tenant, 0)

    def victims_for(self, job: JobView, min_tier: int = 0) -> list[Lease] | None:
        picked: list[Lease] = []
        pool = [x for x in self.up if x.job_id not in self.yielded and x.tenant != job.tenant
                and attained_tier(x.used) >= min_tier]

        def excess(tenant: str) -> int:  # over quota, counting what it already gave up here
            return self.over(tenant) - sum(p.gpus for p in picked if p.tenant == tenant)

        def order(x: Lease) -> tuple[float, float, float, str]:
            begun = x.started if x.lease_start is None else x.lease_start
            return (-excess(x.tenant), -_ratio(self.state.get(x.tenant)), begun, x.job_id)

        while self.free + sum(p.gpus for p in picked) < job.gpus or (
                self.fits is not None and not self.fits(job, picked)):
            pool = [x for x in pool if excess(x.tenant) > 0]
            if not pool:
                return None
            pool.sort(key=order)
            picked.append(pool.pop(0))
        return picked

    def take(self, job: JobView) -> bool:
        holding, quota = self.holding, self.quota
        starving = fair_job_key(job, self.now, self.cfg)[0] == 0  # waited long and still owed (F_j < 1)
        if not may_displace(holding.get(job.tenant, 0), quota.get(job.tenant, 0), job.gpus) and not starving:
            return False
        return self._give(job, self.victims_for(job), "is under-served")

    def take_burst(self, job: JobView) -> bool:
        """A short burst borrows from another borrower whose expired lease has attained more."""
        if job.id in self.taken:
            return False
        return self._give(job, self.victims_for(job, attained_tier(job.used) + 1),
                          "is a short burst (under a GPU-hour so far, forecast to end within a lease)")

    def _give(self, job: JobView, picked: list[Lease] | None, why: str) -> bool:
        holding, quota = self.holding, self.quota
        if picked is None:
            return False
        for x in picked:
            reason = (f"tenant {x.tenant} holds {holding[x.tenant]} GPUs over its quota of {quota[x.tenant]}; "
                      f"its lease expired and {job.tenant}'s job {job.id} {why}")
            self.yielded[x.job_id] = Yield(x.job_id, x.tenant, x.gpus, job.id, job.tenant, reason)
            holding[x.tenant] -= x.gpus
            if x.tenant in self.state:
                self.state[x.tenant].allocated -= x.gpus
        self.free += sum(x.gpus for x in picked) - job.gpus
        holding[job.tenant] = holding.get(job.tenant, 0) + job.gpus
        self.taken.add(job.id)
        return True

    def own(self, tenant: str, takers: list[JobView]) -> None:
        """A tenant within its quota: its expired leases yield to its own waiting jobs of a
        lower attained tier (each to the first such taker that fits on what it frees)."""
        mine = [x for x in self.up if x.tenant == tenant and x.job_id not in self.yielded]
        if not mine or not takers:
            return
        ids = set(own_yields([(x.job_id, x.gpus, x.used) for x in mine], [(j.gpus, j.used) for j in takers]))
        for x in mine:
            if x.job_id not in ids:
                continue
            to = next((j for j in takers if attained_tier(j.used) < attained_tier(x.used)
                       and (self.fits is None or self.fits(j, [x]))), None)
            if to is None:
                continue
            self.yielded[x.job_id] = Yield(
                x.job_id, x.tenant, x.gpus, to.id, tenant,
                f"its lease expired after {x.used / 3600:.1f} GPU-hours; {tenant}'s job {to.id} has had less "
                f"(least attained service inside the tenant)")
            self.holding[tenant] -= x.gpus


def _ratio(t: TenantState | None) -> float:
    return t.used / t.entitled if t is not None and t.entitled > 0 else 0.0
