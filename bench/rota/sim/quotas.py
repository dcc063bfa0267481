"""Tenant quotas in `rota sim --quotas QUOTAS.csv`: the core's rules (rota.core.fairness.quotas)
over any of the simulator's policies.

- a limit: every start goes through `admit` (the policy's placement is refused when it
  would take the tenant, or an ancestor, past its limit);
- a guarantee: after each round, `reclaims` names borrowers' running jobs to checkpoint so
  that waiting jobs within their tenant's guarantee start; each is preempted as a lease
  expiry is (it keeps its GPUs `checkpoint_s` longer), and the owner's job takes the freed
  block as soon as the checkpoint ends.

QUOTAS.csv: `tenant,guaranteed,limit[,parent]` (an empty limit: no cap). Every simulated job
is preemptible, so any tenant may borrow up to its limit.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rota.core.fairness.quotas import Asking, Holding, Quota, QuotaError, check_quota, limit_reason, reclaims
from rota.sim.engine import PENDING, RUNNING, Policy, Run, SimConfig, Simulator, TryPlace
from rota.sim.metrics import JobRecord
from rota.sim.workload import Job, TraceError


def read_quotas(path: str | Path) -> dict[str, Quota]:
    """QUOTAS.csv as quotas, each checked as `rota tenants add` checks it (field named)."""
    out: dict[str, Quota] = {}
    with open(path, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            try:
                limit = (row.get("limit") or "").strip()
                q = Quota(row["tenant"].strip(), int(row.get("guaranteed") or 0), int(limit) if limit else None,
                          (row.get("parent") or "").strip())
            except (KeyError, ValueError) as e:
                raise TraceError(f"{path}:{n}: expected tenant,guaranteed,limit[,parent] ({e})") from e
            out[q.tenant] = q
    for q in out.values():
        try:
            check_quota(q, {k: v for k, v in out.items() if k != q.tenant})
        except QuotaError as e:
            raise TraceError(f"{path}: tenant {q.tenant}: {e}") from e
    return out


class QuotaPolicy:
    """A policy whose placements pass the limits first."""

    def __init__(self, inner: Policy, quotas: Mapping[str, Quota]) -> None:
        self.inner, self.quotas = inner, quotas
        self.name, self.preemptive = inner.name, inner.preemptive

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Callable[[], bool]) -> None:
        extra: dict[str, int] = {}

        def gated(r: Run, displace: bool = True) -> bool:
            if r.state == PENDING and not within_limits(self.quotas, sim.holding, extra, r):
                return False
            placed = try_place(r, displace)
            if placed and r.state == PENDING:
                extra[r.tenant] = extra.get(r.tenant, 0) + r.gpus
            return placed

        # A job over its limit is out of the queue (as the live allocator holds it back), so
        # it blocks no one behind it (FIFO's head would).
        cands = [r for r in cands if r.state != PENDING or within_limits(self.quotas, sim.holding, extra, r)]
        self.inner.walk(sim, now, cands, gated, done)


def within_limits(quotas: Mapping[str, Quota], holding: Mapping[str, int], extra: Mapping[str, int], r: Run) -> bool:
    held = {t: n + extra.get(t, 0) for t, n in holding.items()}
    return limit_reason(quotas, held, r.tenant, r.gpus) is None


class QuotaSimulator(Simulator):
    """The simulator with reclaims after every round; `reclaimed` counts the borrowers paused."""

    def __init__(self, jobs: Sequence[Job], shares: Mapping[str, float], cfg: SimConfig, policy: Policy,
                 quotas: Mapping[str, Quota]) -> None:
        super().__init__(jobs, shares, cfg, QuotaPolicy(policy, quotas))
        self.quotas = quotas
        self.reclaimed = 0

    def _round(self, now: float, expired: list[Run]) -> None:
        super()._round(now, expired)
        self._reclaim(now)

    def reserve(self, r: Run) -> None:
        """`fair`'s reservation for a starving job starts it without the policy's placement:
        never for a job over its limit."""
        if within_limits(self.quotas, self.holding, {}, r):
            super().reserve(r)

    def _start_reserved(self, now: float) -> None:
        r = self.resv
        if r is not None and r.state == PENDING and not within_limits(self.quotas, self.holding, {}, r):
            self._drop_reservation()  # its tenant reached its limit while the block drained
            return
        super()._start_reserved(now)

    def _reclaim(self, now: float) -> None:
        # Only a tenant below its guarantee reclaims (the core checks again, subtree counted):
        # most rounds have none, and then nothing else is built.
        owners = [r for r in self.pending.values() if (q := self.quotas.get(r.tenant)) is not None
                  and self.holding.get(r.tenant, 0) + r.gpus <= q.guaranteed]
        if not owners:
            return
        owners.sort(key=lambda r: (r.pending_since, r.idx))
        per = self.cfg.gpus_per_node
        running = [r for r in self.runs if r.state == RUNNING]
        free = self._free_by_node()
        found = reclaims(
            self.quotas,
            [Holding(str(r.idx), r.tenant, r.gpus, node=str(r.block // per), movable=True,
                     cost_s=self.cfg.checkpoint_s + self.cfg.resume_s, started_s=r.last_start) for r in running],
            [Asking(str(r.idx), r.tenant, r.gpus, preemptible=True) for r in owners], free,
            gang_nodes=lambda a: max(1, self.runs[int(a.job_id)].gpus // per))
        if not found:
            return
        for victim in found:
            r = self.runs[int(victim.job_id)]
            self._release(r.block, r.order)
            self._preempt(r, now)
            self.reclaimed += 1
        for owner in {int(v.for_job) for v in found}:
            r = self.runs[owner]
            off = self.alloc.alloc(r.order, None, True, r.allowed)
            if off is not None:
                self._start(r, off, now)  # it starts when the borrower's checkpoint ends (busy_until)

    def _free_by_node(self) -> dict[str, int]:
        per = self.cfg.gpus_per_node
        free = {str(n): 0 for n in range(self.cfg.gpus // per)}
        for k, offs in enumerate(self.alloc.free):
            for off in offs:
                for g in range(off, off + (1 << k)):
                    free[str(g // per)] = free.get(str(g // per), 0) + 1
        return free


def peak_holding(records: Sequence[tuple[str, int, list[list[float]]]]) -> dict[str, int]:
    """Each tenant's most GPUs held at once, from the schedule's intervals: what the limits bound."""
    events: dict[str, list[tuple[float, int]]] = {}
    for tenant, gpus, intervals in records:
        for start, end in intervals:
            events.setdefault(tenant, []).extend([(start, gpus), (end, -gpus)])
    peaks: dict[str, int] = {}
    for tenant, evs in events.items():
        held = best = 0
        for _, delta in sorted(evs, key=lambda e: (e[0], e[1])):  # ends before starts at one instant
            held += delta
            best = max(best, held)
        peaks[tenant] = best
    return peaks


def quota_figures(sim: QuotaSimulator, records: Sequence[JobRecord]) -> dict[str, object]:
    """What `rota sim --quotas` adds to a policy's figures: borrowers reclaimed, and each
    tenant's peak GPUs against its limit (a peak above the limit would be a broken limit)."""
    peaks = peak_holding([(r.tenant, r.gpus, r.intervals) for r in records])
    over = {t: peaks.get(t, 0) - q.limit for t, q in sim.quotas.items() if q.limit is not None and peaks.get(t, 0) > q.limit}
    return {"reclaims": sim.reclaimed, "peak_gpus": peaks, "over_limit": over}


def quota_line(policy: str, figures: Mapping[str, object]) -> str:
    """The table's line of a policy's quota figures."""
    over = figures.get("over_limit") or {}
    return f"{policy}: {figures['reclaims']} borrowers reclaimed; tenants over their limit: {over or 'none'}"
