"""Standings from recorded history (pure): what the ledger service reports.

The ledger knows intervals, not ticks: when each job demanded GPUs (from submission until
it finished) and when each lease held them (its usage rows). These functions replay those
intervals through the accounting core of `rota.core.fairness.ltgf` (TenantAccount over hourly
buckets, JobShareClock), so the service, the simulator and the `fair` policy agree on
every number. Times are seconds since the epoch; results are GPU-seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rota.core import jobstate
from rota.core.fairness.ltgf import FairnessConfig, JobShareClock, TenantAccount, TenantStanding, ratio


@dataclass(frozen=True)
class Span:
    """`gpus` GPUs demanded or held over [start, end). Held spans the ledger replays are
    weighted GPUs (the rates of their GPUs' types, rota.core.fairness.rates), so not whole."""

    start: float
    end: float
    gpus: float


@dataclass(frozen=True)
class JobLife:
    """A job as the job-level clock sees it: active from arrival until it finished, or,
    when `runnable` is given (what demand_intervals returns), only over those intervals."""

    id: str
    gpus: int
    weight: float  # w_j: the job's priority, as in the simulator
    arrival: float
    finished: float | None = None
    runnable: tuple[tuple[float, float | None], ...] | None = None

    def intervals(self) -> tuple[tuple[float, float | None], ...]:
        return self.runnable if self.runnable is not None else ((self.arrival, self.finished),)


def demand_intervals(
    created: float, finished: float | None, *, started: float | None, holdable: bool, held_now: bool,
    paused: Sequence[tuple[float, float | None]] = (),
) -> tuple[tuple[float, float | None], ...]:
    """When a job demanded GPUs, the intervals D accrues over (end None: still now).

    From submission until it finished, except: a job its own submission can hold back
    (`holdable`: a task of an array with a %K cap, a job with dependencies) demands from
    when it first started, or, never started, from submission only while it is runnable
    now (not `held_now`); a cancelled task that the cap held all its life never demanded.
    The `paused` intervals (PAUSED: a pause asked for, not the cluster's doing) are cut out."""
    start: float | None = created
    if holdable:
        start = started if started is not None else (None if held_now or finished is not None else created)
    if start is None:
        return ()
    out: list[tuple[float, float | None]] = []
    cursor: float | None = start
    for a, b in sorted(paused):
        if cursor is None or (finished is not None and a >= finished):
            break
        if b is not None and b <= cursor:
            continue
        if a > cursor:
            out.append((cursor, a))
        cursor = b
    if cursor is not None and (finished is None or finished > cursor):
        out.append((cursor, finished))
    return tuple(out)


def job_fairness_applies(state: str, deserved: float, *, started: bool, held_now: bool) -> bool:
    """Whether F_j = U_j / D_j reads as a number: only for a job that has started (one that
    never ran has no use to set against its share: its D_j and its wait say what it is
    owed), that demanded (D_j > 0), and that is runnable now (not PAUSED, not held back by
    its array's cap or a dependency)."""
    if not started or deserved <= 0 or state == jobstate.PAUSED:
        return False
    return not (state == jobstate.PENDING and held_now)


@dataclass(frozen=True)
class JobStanding:
    id: str
    deserved: float  # D_j, GPU-seconds since arrival
    used: float  # U_j, GPU-seconds it ran

    @property
    def fairness(self) -> float:
        return ratio(self.used, self.deserved)


def window_start(now: float, cfg: FairnessConfig) -> float:
    """Start of the oldest bucket the sliding window at `now` reads (see HourlyWindow)."""
    buckets = max(1, round(cfg.window_s / cfg.bucket_s))
    return (math.floor(now / cfg.bucket_s) - buckets + 1) * cfg.bucket_s


def tenant_standing(
    tenant: str,
    quota: int,
    since: float,
    now: float,
    demand: Iterable[Span],
    running: Iterable[Span],
    cfg: FairnessConfig | None = None,
) -> TenantStanding:
    """W, D and U of one tenant over the window at `now`, accrued from `since` (the window's
    start, or later when the tenant is younger): W = Q·t, D = ∫ min(demand, Q), U = ∫ running."""
    cfg = cfg or FairnessConfig()
    since = max(since, window_start(now, cfg))
    deltas: dict[float, list[float]] = {}
    for spans, k in ((demand, 0), (running, 1)):
        for s in spans:
            a, b = max(s.start, since), min(s.end, now)
            if b > a:  # clipped to the window; a span outside it changes nothing
                deltas.setdefault(a, [0, 0])[k] += s.gpus
                deltas.setdefault(b, [0, 0])[k] -= s.gpus
    account = TenantAccount(tenant, quota, cfg)
    account.since = since  # accrue from here, not from the epoch
    level = [0.0, 0.0]
    for t in sorted(deltas):
        level = [level[0] + deltas[t][0], level[1] + deltas[t][1]]
        account.set_load(t, level[0], level[1])
    return account.standing(now)


def used_in_window(tenant_since: float, now: float, running: Iterable[Span], cfg: FairnessConfig | None = None) -> float:
    """∫ running over the window at `now` (from `tenant_since` when later): the U that
    tenant_standing reports for the same spans, without the rest of the accounting."""
    cfg = cfg or FairnessConfig()
    since = max(tenant_since, window_start(now, cfg))
    return sum(max(0.0, min(s.end, now) - max(s.start, since)) * s.gpus for s in running)


def job_standings(
    quota: int, jobs: Iterable[JobLife], used: Mapping[str, float], now: float
) -> dict[str, JobStanding]:
    """D_j for every job of one tenant by replaying arrivals and departures through the
    share clock (s_j = w_j / Σ active w · Q); U_j comes from the usage rows (`used`).

    `jobs` must hold every job active at any time since the earliest arrival among them,
    since each one changes the others' shares while it is active."""
    clock = JobShareClock(quota)
    events: list[tuple[float, int, JobLife]] = []
    deserved: dict[str, float] = {}
    for j in jobs:
        for start, end in j.intervals():  # a job paused and resumed leaves and comes back
            if start <= now:
                deserved.setdefault(j.id, 0.0)
                events.append((start, 1, j))
                if end is not None and end <= now:
                    events.append((end, 0, j))  # departures first at a tie: 0 sorts before 1
        if j.runnable == () and j.arrival <= now:
            deserved.setdefault(j.id, 0.0)  # it never demanded: D_j 0
    for t, kind, j in sorted(events, key=lambda e: (e[0], e[1], e[2].id)):
        if kind == 1:
            clock.add(t, j.id, j.gpus, j.weight)
        else:
            deserved[j.id] += clock.remove(t, j.id)
    for job_id in clock.jobs:
        deserved[job_id] += clock.deserved(now, job_id)
    return {k: JobStanding(k, d, used.get(k, 0.0)) for k, d in deserved.items()}
