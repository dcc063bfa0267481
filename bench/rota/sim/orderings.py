"""The seven policies `rota sim` compares, each as an ordering of one round's candidates.

- fifo: strict arrival order, no preemption; the queue head blocks everyone behind it
  (docs/design.md §3's FIFO baseline: start times never decrease along the queue).
- sjf:  shortest job first on the planned durations (`--durations`; oracle by default),
  no preemption, smaller jobs backfill.
- easy: FIFO with EASY backfilling on the planned durations (rota.sim.backfill).
- las:  Tiresias-style two-dimensional least attained service: jobs sit in queues by
  GPU-seconds received (GPUs × time; thresholds 1, 10, 100, 1000 GPU-hours, Tiresias's
  discretisation, which stops two near-equal jobs from swapping at every lease), FIFO
  within a queue; preempting at lease expiry.
- drf:  instantaneous max-min fairness: the tenant holding the fewest GPUs per unit of
  share goes next (FIFO within it); preempts at lease expiry. Single resource, so DRF's
  dominant share is just the GPU share.
- ftf:  Themis-style finish-time fairness: largest ρ = T_shared / T_ideal first, with
  T_shared = time waited so far + work left and T_ideal = duration stretched by how far
  the tenant's demand exceeds its quota (the job's finish time in a private cluster of
  the tenant's fair share); preempts at lease expiry.
- fair: ASTRAEA's two-stage rule over the LTGF ledger (rota.core.fairness.twostage).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
from rota.sim.backfill import Easy
from rota.sim.engine import PENDING, Run, Simulator, TryPlace

Done = Callable[[], bool]
LAS_THRESHOLDS_GPU_S = [3600.0, 36000.0, 360000.0, 3600000.0]


def _greedy(cands: list[Run], try_place: TryPlace, done: Done) -> None:
    for r in cands:
        if done():
            return
        try_place(r)


def _fitting(sim: Simulator, cands: list[Run]) -> list[Run]:
    """Candidates that could fit in the largest block that is or may become free; the rest
    are left out before sorting (not for fifo, whose head blocks even when it cannot fit)."""
    largest = sim.alloc.largest_free_order()
    return [r for r in cands if r.order <= largest]


def _by_tenant(sim: Simulator, cands: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in cands:
        out.setdefault(r.tenant, []).append(r)
    return out


def _allocated(sim: Simulator, cands: list[Run]) -> dict[str, int]:
    """GPUs each tenant holds outside this round's contest (expired leases excluded)."""
    alloc = dict(sim.holding)
    for r in cands:
        if r.state != PENDING:
            alloc[r.tenant] -= r.gpus
    return alloc


@dataclass
class Fifo:
    name: str = "fifo"
    preemptive: bool = False

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        for r in sorted(cands, key=lambda r: (r.job.submit_s, r.idx)):
            if done() or not try_place(r):
                return


@dataclass
class Sjf:
    name: str = "sjf"
    preemptive: bool = False

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        _greedy(
            sorted(_fitting(sim, cands), key=lambda r: (r.job.planned, r.job.submit_s, r.idx)),
            try_place,
            done,
        )


@dataclass
class Las:
    name: str = "las"
    preemptive: bool = True

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        def queue(r: Run) -> int:
            return bisect.bisect_right(LAS_THRESHOLDS_GPU_S, r.gpus * r.held(now))

        _greedy(
            sorted(_fitting(sim, cands), key=lambda r: (queue(r), r.job.submit_s, r.idx)), try_place, done
        )


@dataclass
class Ftf:
    name: str = "ftf"
    preemptive: bool = True

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        def rho(r: Run) -> float:
            left = r.remaining - max(0.0, now - r.work_start) if r.state != PENDING else r.remaining
            shared = (now - r.job.submit_s) + left
            stretch = max(1.0, sim.demand[r.tenant] / max(1, sim.quota[r.tenant]))
            return shared / (r.job.duration_s * stretch)

        _greedy(sorted(_fitting(sim, cands), key=lambda r: (-rho(r), r.job.submit_s, r.idx)), try_place, done)


@dataclass
class Drf:
    name: str = "drf"
    preemptive: bool = True

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        alloc = _allocated(sim, cands)
        groups = _by_tenant(sim, _fitting(sim, cands))
        tenants = {t: TenantState(t, sim.quota[t], alloc[t], 0.0, 0.0, share=sim.shares[t]) for t in groups}

        def key(t: TenantState) -> tuple[float, ...]:
            return (t.allocated / t.share if t.share > 0 else float("inf"),)

        def jobs_of(t: str) -> list[Run]:
            return sorted(groups[t], key=lambda r: (r.job.submit_s, r.idx))

        tenant_walk(tenants, jobs_of, key, try_place, 0.0, done)


@dataclass
class Fair:
    """ASTRAEA. At lease expiry only a job of a tenant holding more than its quota is up for
    grabs, and only a job that keeps its tenant within quota (or a starving job) may take
    its GPUs: a borrower yields to an under-served tenant, and to another borrower only for
    a short burst (`bursts`, `twostage.burst_borrower`).

    With `bursts` (ours, the default) the walk runs in three passes over the same
    standings: (a) what keeps each tenant within its quota, and starving jobs; (b) bursts:
    waiting jobs still in the lowest attained tier and forecast (`Job.planned`) to end
    within a lease, which may take the GPUs of other borrowers' expired jobs that have
    attained more; (c) the rest, borrowing only idle GPUs. Without it, one walk (the
    previous rule, kept for comparison).

    A starving reservation (`Simulator.reserve`) is made only for a job still owed
    (`reserve_owed`): a job that has had its due and waits again is served like any other,
    as in the stage-2 order, instead of draining a block, pausing whatever runs in it."""

    name: str = "fair"
    preemptive: bool = True
    bursts: bool = True
    # Reserve a block only for a job starving by `fair_job_key` (still owed, F_j < 1), the
    # same rule that lets a starving job displace borrowers; False: for the oldest job
    # waiting past the threshold, owed or not (the rule before, kept for comparison).
    reserve_owed: bool = True

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Done) -> None:
        cfg = sim.fcfg
        alloc = _allocated(sim, cands)
        # 1. Renewals of tenants within their quota are not contested.
        contest = _renew_within_quota(sim, cands, alloc, try_place, now)
        # 2. Pending jobs too large for every block that is or may become free sit out.
        largest = sim.alloc.largest_free_order()
        for t, queue in sim.pending_by_tenant.items():
            fits = [r for r in queue.values() if r.order <= largest]
            if fits:
                contest.setdefault(t, []).extend(fits)
        if not contest:
            return
        tenants: dict[str, TenantState] = {}
        for t in contest:
            st = sim.accounts[t].standing(now)
            tenants[t] = TenantState(t, st.quota, alloc[t], st.used, st.entitled, share=sim.shares[t])
        starving: set[int] = set()

        def key(r: Run) -> tuple[int, float, float]:
            return _fair_key(sim, r, now, starving)

        def jobs_of(t: str) -> list[Run]:
            return sorted(contest[t], key=key)

        def place(r: Run) -> bool:
            t = tenants[r.tenant]
            # Displacing only what keeps the taker within its quota stops ping-pong: a
            # taker that went over quota would itself be displaced at its next expiry.
            return try_place(r, displace=may_displace(t.allocated, t.quota, r.gpus) or r.idx in starving)

        # 3. The two-stage walk over the rest.
        if not self.bursts:
            tenant_walk(tenants, jobs_of, lambda t: fair_tenant_key(t, cfg), place, cfg.lease_s, done)
        else:
            _three_passes(sim, now, contest, tenants, key, place, try_place, done)
        # 4. The oldest starving job still unplaced gets a block reserved and drained for it.
        oldest = _to_reserve(sim, now, starving, self.reserve_owed)
        if oldest is not None:
            sim.reserve(oldest)


def _to_reserve(sim: Simulator, now: float, starving: set[int], owed: bool) -> Run | None:
    """The job a starving reservation is for: the oldest waiting past the threshold that is
    starving by `fair_job_key` (still owed, F_j < 1) when `owed`, else the oldest waiting
    past the threshold (the rule before). Pending is in queueing order."""
    cfg = sim.fcfg
    for r in sim.pending.values():
        if now - r.pending_since < cfg.starvation_s:
            return None
        if not owed or _fair_key(sim, r, now, starving)[0] == 0:
            return r
    return None


def _three_passes(sim: Simulator, now: float, contest: dict[str, list[Run]], tenants: dict[str, TenantState],
                  key: Callable[[Run], tuple[int, float, float]], place: Callable[[Run], bool],
                  try_place: TryPlace, done: Done) -> None:
    """`Fair`'s walk with bursts: within quota, then bursts, then the rest (see `Fair`)."""
    cfg = sim.fcfg
    placed: set[int] = set()

    def once(fn: Callable[[Run], bool]) -> Callable[[Run], bool]:
        def go(r: Run) -> bool:
            if r.idx in placed or not fn(r):
                return False
            placed.add(r.idx)
            return True
        return go

    def within(r: Run) -> bool:
        t = tenants[r.tenant]
        if not may_displace(t.allocated, t.quota, r.gpus) and key(r)[0] != 0:  # key 0: starving
            return False
        return try_place(r, displace=True)

    def walk(queues: dict[str, list[Run]], fn: Callable[[Run], bool], order: Callable[[Run], Any]) -> None:
        queues = {t: q for t, q in queues.items() if q}
        if queues and not done():
            tenant_walk({t: tenants[t] for t in queues}, lambda t: sorted(queues[t], key=order),
                        lambda t: fair_tenant_key(t, cfg), once(fn), cfg.lease_s, done)

    # a. Within quota (and starving jobs), tenants in two-stage order.
    walk(contest, within, key)
    # b. Bursts. A bursting tenant keeps its own expired jobs first (a burst borrows from
    #    others, it does not evict its own tenant), and an expired job still in the lowest
    #    tier keeps its GPUs; a burst may take the rest of the borrowers' expired GPUs.
    bursts: dict[str, list[Run]] = {}
    for t, rs in contest.items():
        left = [r for r in rs if r.idx not in placed]
        takers = [r for r in left if r.state == PENDING
                  and burst_borrower(r.gpus * r.held_s, r.job.planned - (r.job.duration_s - r.remaining), cfg.lease_s)]
        if takers:
            bursts[t] = [r for r in left if r.state != PENDING] + takers
        else:
            bursts[t] = [r for r in left if r.state != PENDING and attained_tier(r.gpus * r.held(now)) == 0]
    walk(bursts, lambda r: try_place(r, displace=True), lambda r: (r.state == PENDING, key(r)))
    # c. The rest: a borrower yields only to what keeps its taker within quota (`place`).
    walk({t: [r for r in rs if r.idx not in placed] for t, rs in contest.items()}, place, key)


def _renew_within_quota(sim: Simulator, cands: list[Run], alloc: dict[str, int], try_place: TryPlace,
                        now: float) -> dict[str, list[Run]]:
    """Renews the running candidates of tenants within their quota, except those that yield
    to the tenant's own waiting jobs of a lower attained-service tier (`own_yields`), which
    contest with the rest (over-quota tenants' running candidates)."""
    contest: dict[str, list[Run]] = {}
    mine: dict[str, list[Run]] = {}
    for r in cands:
        if r.state == PENDING:
            continue
        if sim.holding[r.tenant] <= sim.quota[r.tenant]:
            mine.setdefault(r.tenant, []).append(r)
        else:
            contest.setdefault(r.tenant, []).append(r)
    for t, runs in mine.items():
        yielding: set[str] = set()
        if sim.pending_by_tenant[t]:  # its own waiting jobs of a lower attained tier first
            waiting = [(p.gpus, p.gpus * p.held_s) for p in sim.pending_by_tenant[t].values()]
            yielding = set(own_yields([(r.job.id, r.gpus, r.gpus * r.held(now)) for r in runs], waiting))
        for r in runs:
            if r.job.id in yielding:
                contest.setdefault(t, []).append(r)
            else:
                try_place(r)
                alloc[t] += r.gpus
    return contest


def _fair_key(sim: Simulator, r: Run, now: float, starving: set[int]) -> tuple[int, float, float]:
    """fair_job_key of a run; a starving run's index goes into `starving`."""
    cfg = sim.fcfg
    # Fast path, same result as fair_job_key: a job that has not run yet and is not
    # starving has U_j = 0 < D_j, so F_j = 0 (most of a long queue looks like this).
    if r.state == PENDING and r.held_s == 0 and now - r.pending_since < cfg.starvation_s:
        if sim.quota[r.tenant] > 0 and now > r.job.submit_s:
            return (1, 0.0, r.job.submit_s)
    view = JobView(
        r.job.id,
        r.tenant,
        r.gpus,
        r.job.submit_s,
        used=r.gpus * r.held(now),
        deserved=sim.clocks[r.tenant].deserved(now, r.job.id),
        pending_since=r.pending_since if r.state == PENDING else None,
    )
    k = fair_job_key(view, now, cfg)
    if k[0] == 0:
        starving.add(r.idx)
    return k


POLICIES: dict[str, Callable[[], Fifo | Sjf | Las | Ftf | Drf | Fair | Easy]] = {
    "fifo": Fifo,
    "sjf": Sjf,
    "las": Las,
    "drf": Drf,
    "ftf": Ftf,
    "fair": Fair,
    "easy": Easy,
}
