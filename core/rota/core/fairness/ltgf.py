"""Long-term GPU-time fairness (LTGF, docs/design.md §4): the pure accounting core.

Shared by the ledger service, the allocator's `fair` policy and the simulator, so all
three compute the same numbers. Nothing here reads a clock: every call takes `now` (or a
time span) in seconds, and state only moves when the caller says so.

Tenant level (per tick Δ, hourly buckets, sliding 24 h window):
    Q_u = floor(G · share_u / Σ share)          quota, GPUs
    W_u += Q_u · Δ                               entitled GPU-seconds
    D_u += min(demand_u, Q_u) · Δ                deserved; demand = Σ n_j of running + pending
    U_u += Σ_running n_j · Δ                     used
    F_u = U_u / D_u  (1 when D_u = 0)
Job level (from arrival, not windowed):
    s_j = w_j / Σ_{active k of u} w_k · Q_u,  D_j += min(n_j, s_j) · Δ,  U_j = n_j · run time,
    F_j = U_j / D_j.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FairnessConfig:
    """Knobs of docs/design.md §4; the defaults are the spec's."""

    lease_s: float = 1800.0
    starvation_s: float = 4 * 3600.0
    delay_s: float = 300.0  # a job restarted less than this ago is not preempted again
    window_s: float = 24 * 3600.0
    bucket_s: float = 3600.0
    low_usage_frac: float = 0.2  # a tenant using under this fraction of its quota goes first


def quotas(total_gpus: int, shares: Mapping[str, float]) -> dict[str, int]:
    """Q_u = floor(G · share_u / Σ share). Rounding down can leave a few GPUs unassigned;
    they are not anyone's entitlement, only borrowable."""
    total_share = sum(shares.values())
    if total_share <= 0:
        return {t: 0 for t in shares}
    # The small epsilon keeps exact products such as 8 * 0.3 / 0.6 = 3.9999... at 4.
    return {t: math.floor(total_gpus * s / total_share + 1e-9) for t, s in shares.items()}


def ratio(used: float, deserved: float) -> float:
    """F = U / D, defined as 1 when nothing was deserved (nobody was owed anything)."""
    return 1.0 if deserved <= 0 else used / deserved


def jain(values: Iterable[float]) -> float:
    """Jain's index (ΣF)² / (n · ΣF²): 1 when all equal, 1/n when one takes everything."""
    xs = list(values)
    sq = sum(x * x for x in xs)
    return 1.0 if not xs or sq == 0 else sum(xs) ** 2 / (len(xs) * sq)


class HourlyWindow:
    """Per-bucket sums of (entitled, deserved, used) GPU-seconds, read over a sliding window.

    The window at time `now` is the bucket holding `now` plus the previous ones, so with
    hourly buckets and 24 h it spans between 23 and 24 hours of history.
    """

    def __init__(self, bucket_s: float = 3600.0, window_s: float = 24 * 3600.0) -> None:
        self.bucket_s = bucket_s
        self.n_buckets = max(1, round(window_s / bucket_s))
        self.buckets: dict[int, list[float]] = {}

    def add(self, t0: float, t1: float, rates: tuple[float, float, float]) -> None:
        """Accrue constant rates (GPUs) over [t0, t1), split at bucket boundaries."""
        t = t0
        while t < t1:
            b = int(t // self.bucket_s)
            end = min(t1, (b + 1) * self.bucket_s)
            row = self.buckets.setdefault(b, [0.0, 0.0, 0.0])
            dt = end - t
            row[0] += rates[0] * dt
            row[1] += rates[1] * dt
            row[2] += rates[2] * dt
            t = end
        self._prune(int(t1 // self.bucket_s))

    def _prune(self, current: int) -> None:
        if len(self.buckets) > self.n_buckets + 1:
            for b in [b for b in self.buckets if b <= current - self.n_buckets]:
                del self.buckets[b]

    def totals(self, now: float) -> tuple[float, float, float]:
        current = int(now // self.bucket_s)
        w = d = u = 0.0
        for b, row in self.buckets.items():
            if current - self.n_buckets < b <= current:
                w, d, u = w + row[0], d + row[1], u + row[2]
        return w, d, u


@dataclass(frozen=True)
class TenantStanding:
    tenant: str
    quota: int
    entitled: float  # GPU-seconds in the window
    deserved: float
    used: float

    @property
    def fairness(self) -> float:
        return ratio(self.used, self.deserved)


class TenantAccount:
    """W, D and U of one tenant, accrued at piecewise-constant rates.

    The caller reports each change of load with `set_load(now, demand, running)`; the
    span since the previous report is accrued at the previous rates. Lazy accrual keeps
    the cost per change O(buckets crossed) instead of O(ticks).
    """

    def __init__(self, tenant: str, quota: int, cfg: FairnessConfig | None = None) -> None:
        cfg = cfg or FairnessConfig()
        self.tenant = tenant
        self.quota = quota
        self.window = HourlyWindow(cfg.bucket_s, cfg.window_s)
        self.since = 0.0
        self.demand: float = 0
        self.running: float = 0  # GPUs, or weighted GPUs when the caller rates them by type

    def _flush(self, now: float) -> None:
        if now > self.since:
            rates = (float(self.quota), float(min(self.demand, self.quota)), float(self.running))
            self.window.add(self.since, now, rates)
        self.since = max(self.since, now)

    def set_load(self, now: float, demand: float, running: float) -> None:
        self._flush(now)
        self.demand, self.running = demand, running

    def standing(self, now: float) -> TenantStanding:
        self._flush(now)
        w, d, u = self.window.totals(now)
        return TenantStanding(self.tenant, self.quota, w, d, u)


@dataclass
class _RateKey:
    """∫ min(r, X(t)) dt for one ratio r = n_j / w_j, with X = Q_u / Σ w (see JobShareClock)."""

    integral: float = 0.0
    members: int = 0


@dataclass
class JobShareClock:
    """Deserved GPU-seconds D_j of the active jobs of one tenant.

    D_j = ∫ min(n_j, w_j·X) dt = w_j · ∫ min(n_j/w_j, X) dt with X = Q_u / Σ_active w.
    X only changes when a job arrives or leaves, so one running integral per distinct
    ratio n/w (a handful: GPU counts are powers of two) serves every job: a job stores
    the integral at its arrival and reads the difference. Each change costs O(ratios),
    each read O(1).
    """

    quota: int
    since: float = 0.0
    total_weight: float = 0.0
    keys: dict[float, _RateKey] = field(default_factory=dict)
    jobs: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # id -> (r, w, base)

    @property
    def level(self) -> float:
        return self.quota / self.total_weight if self.total_weight > 0 else 0.0

    def _advance(self, now: float) -> None:
        dt = now - self.since
        if dt > 0:
            x = self.level
            for r, key in self.keys.items():
                key.integral += min(r, x) * dt
        self.since = max(self.since, now)

    def add(self, now: float, job_id: str, gpus: int, weight: float = 1.0) -> None:
        self._advance(now)
        r = gpus / weight
        key = self.keys.setdefault(r, _RateKey())
        key.members += 1
        self.jobs[job_id] = (r, weight, key.integral)
        self.total_weight += weight

    def deserved(self, now: float, job_id: str) -> float:
        r, w, base = self.jobs[job_id]
        key = self.keys[r]
        pending = min(r, self.level) * max(0.0, now - self.since)
        return w * (key.integral + pending - base)

    def remove(self, now: float, job_id: str) -> float:
        """Stop accruing for a finished job and return its final D_j."""
        self._advance(now)
        final = self.deserved(now, job_id)
        r, w, _ = self.jobs.pop(job_id)
        self.total_weight -= w
        key = self.keys[r]
        key.members -= 1
        if key.members == 0:
            del self.keys[r]
        if not self.jobs:
            self.total_weight = 0.0  # no float residue when the tenant goes idle
        return final
