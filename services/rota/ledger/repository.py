"""The ledger's Postgres operations: idempotent usage writes, usage totals, standings inputs.

GPU-seconds are summed in SQL as exact numerics (EXTRACT(EPOCH ...) is `numeric`, the rates
are `numeric` too), so totals by tenant, by job and by GPU over the same rows are equal to
the last digit, raw and weighted alike. Raw GPU-seconds are seconds times GPUs; weighted
ones seconds times the row's weighted GPUs (the rates of its GPUs' types), what fairness
reads.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, and_, delete, func, literal, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.common import read_models
from rota.common.models import TenantRow
from rota.common.read_models import cluster_job_leases as leases
from rota.common.read_models import cluster_jobs as cjobs
from rota.common.read_models import cluster_pause_moves as pause_moves
from rota.core import dependencies, jobstate
from rota.core.errors import AlreadyExists, InvalidArgument
from rota.core.fairness.ltgf import FairnessConfig, quotas
from rota.core.fairness.rates import DEFAULT_RATES, UNKNOWN_RATE, GpuRates
from rota.core.fairness.standings import (
    JobLife,
    Span,
    demand_intervals,
    job_fairness_applies,
    job_standings,
    tenant_standing,
    used_in_window,
    window_start,
)
from rota.ledger.models import HOUR_S, CollectedRow, UsageRow

COLLECTOR_LOCK_KEY = 0x4C656467  # "Ledg"
BY = ("job", "tenant", "user", "day", "gpu")
NO_USER = "-"  # usage of jobs a tenant's own token (or the admin's) submitted


@dataclass(frozen=True)
class UsageRecord:
    """One usage row: GPUs of one lease within one hour; `gpu_types` and `gpu_rates` go with
    `gpu_indices` (empty: unknown types, one per GPU)."""

    lease_id: str
    sequence: int
    job_id: str
    tenant: str
    node: str
    gpu_indices: list[int]
    start: datetime
    end: datetime
    gpu_types: tuple[str, ...] = ()
    gpu_rates: tuple[Decimal, ...] = ()

    def rated(self, gpu_types: Sequence[str], rates: GpuRates) -> UsageRecord:
        return replace(self, gpu_types=tuple(gpu_types), gpu_rates=rates.rates(gpu_types))

    def values(self) -> dict[str, Any]:
        n = len(self.gpu_indices)
        types = self.gpu_types or ("",) * n
        rates = self.gpu_rates or (UNKNOWN_RATE,) * n
        if len(types) != n or len(rates) != n:
            raise ValueError(f"lease {self.lease_id}: {n} GPUs but {len(types)} types and {len(rates)} rates")
        return {
            "lease_id": self.lease_id, "sequence": self.sequence, "job_id": self.job_id,
            "tenant": self.tenant, "node": self.node, "gpu_indices": list(self.gpu_indices),
            "hour": int(self.start.timestamp() // HOUR_S), "start_at": self.start, "end_at": self.end,
            "gpu_types": list(types), "gpu_rates": list(rates), "weighted_gpus": sum(rates, Decimal(0)),
        }


COLLECTED_LEASE = re.compile(r"p\d+(n\d+)?")  # the collector's lease ids (rota.ledger.collector.lease_id)


@dataclass(frozen=True)
class LeaseSource:
    """A placement the collector still has to turn into usage."""

    placement_id: int
    job_id: str
    tenant: str
    node: str
    gpu_indices: list[int]
    start: datetime
    released_at: datetime | None
    gpu_types: tuple[str, ...] = ()  # aligned with gpu_indices; empty: unknown
    node_rank: int = 0  # a gang's placement is one lease per node: this is which


def db_now(session: Session) -> datetime:
    now: datetime = session.execute(select(func.now())).scalar_one()
    return now


def lock_collector(session: Session) -> None:
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": COLLECTOR_LOCK_KEY})


# Writes.
def unsettled_placements(session: Session, after: int, limit: int) -> list[LeaseSource]:
    """Placements never collected, or collected while still open, by id above `after`, with
    the types their GPUs advertised (from the node lifecycle's read model; "" unknown)."""
    stmt = (
        select(leases)
        .outerjoin(CollectedRow, CollectedRow.placement_id == leases.c.placement_id)
        .where(leases.c.placement_id > after, or_(CollectedRow.placement_id.is_(None), CollectedRow.closed.is_(False)),
               # A guest in a host's bubbles is billed from when it took the GPUs over: until
               # then those GPU-seconds are the host's (rota.cluster.guest_leases).
               or_(leases.c.guest_of == "", leases.c.promoted_at.is_not(None)))
        .order_by(leases.c.placement_id)
        .limit(limit)
    )
    rows = session.execute(stmt).all()
    # A gang holds the same GPU indices on every one of its nodes: a lease per node.
    parts = [(p, p.tenant, rank, node) for p in rows for rank, node in enumerate(p.gang_nodes or [p.node])]
    types = read_models.gpu_types(session, {node for _p, _t, _r, node in parts})
    return [
        LeaseSource(p.placement_id, p.job_id, tenant, node, list(p.gpu_indices), p.promoted_at or p.created_at, p.released_at,
                    tuple(types.get((node, i), "") for i in p.gpu_indices), rank)
        for p, tenant, rank, node in parts
    ]


def _upsert(records: Sequence[UsageRecord], *, exact: bool) -> Any:
    stmt = insert(UsageRow).values([r.values() for r in records])
    new = stmt.excluded
    same_lease = and_(
        UsageRow.job_id == new.job_id, UsageRow.tenant == new.tenant, UsageRow.node == new.node,
        UsageRow.gpu_indices == new.gpu_indices, UsageRow.start_at == new.start_at,
    )
    # A repeat changes nothing; a later report of the same open lease only moves the end
    # forward, so a stale retry can never take GPU time back. Types and rates stay as first
    # written: a rate changed since re-rates no GPU-second already charged.
    grows = UsageRow.end_at < new.end_at if not exact else UsageRow.end_at != new.end_at
    return stmt.on_conflict_do_update(
        index_elements=[UsageRow.lease_id, UsageRow.sequence],
        set_={"end_at": new.end_at, "recorded_at": func.now()},
        where=and_(same_lease, grows),
    ).returning(UsageRow.lease_id, UsageRow.sequence)


def extend_usage(session: Session, records: Sequence[UsageRecord]) -> int:
    """Inserts new rows and extends existing ones forward; returns how many changed."""
    if not records:
        return 0
    return len(session.execute(_upsert(records, exact=False)).all())


def settle_lease(session: Session, lease_id: str, records: Sequence[UsageRecord]) -> None:
    """Writes a closed lease's final rows exactly (its end is now known from Postgres) and
    drops any hour an earlier run counted past that end."""
    if records:
        session.execute(_upsert(records, exact=True))
    keep = [r.sequence for r in records]
    session.execute(delete(UsageRow).where(UsageRow.lease_id == lease_id, UsageRow.sequence.not_in(keep)))


def mark_collected(session: Session, placement_id: int, until: datetime, closed: bool) -> None:
    stmt = insert(CollectedRow).values(placement_id=placement_id, collected_until=until, closed=closed)
    session.execute(stmt.on_conflict_do_update(
        index_elements=[CollectedRow.placement_id],
        set_={"collected_until": stmt.excluded.collected_until, "closed": stmt.excluded.closed},
    ))


def record_usage(session: Session, r: UsageRecord, rates: GpuRates = DEFAULT_RATES) -> bool:
    """RecordUsage: True when the row was new or grew; False for a repeat. A record without
    types is rated by the types its node's GPUs advertised (unknown, on a node not registered).

    The collector owns lease ids p<N> and p<N>n<R>; a reporter writing there could double count."""
    if COLLECTED_LEASE.fullmatch(r.lease_id):
        raise InvalidArgument("lease_id", f"{r.lease_id!r}: p<N> (and p<N>n<R>) is reserved for leases collected "
                              "from placements")
    if session.get(TenantRow, r.tenant) is None:
        raise InvalidArgument("tenant", f"unknown tenant {r.tenant!r}")
    if not r.gpu_types:
        types = read_models.gpu_types(session, [r.node])
        r = r.rated([types.get((r.node, i), "") for i in r.gpu_indices], rates)
    if session.execute(_upsert([r], exact=False)).first() is not None:
        return True
    old = session.get(UsageRow, (r.lease_id, r.sequence))
    if old is None:  # unreachable: the insert conflicted with this very key
        raise AlreadyExists(f"lease {r.lease_id} sequence {r.sequence} vanished during the write")
    same = (old.job_id, old.tenant, old.node, list(old.gpu_indices), old.start_at) == (
        r.job_id, r.tenant, r.node, list(r.gpu_indices), r.start
    )
    if not same:
        raise AlreadyExists(
            f"lease {r.lease_id} sequence {r.sequence} is already recorded for job {old.job_id} "
            f"on {old.node} GPUs {list(old.gpu_indices)} from {old.start_at.isoformat()}"
        )
    return False


# Reads.
@dataclass(frozen=True)
class UsageTotal:
    key: str
    tenant: str  # "" when the key spans tenants (day, gpu)
    gpu_seconds: Decimal
    weighted_gpu_seconds: Decimal  # GPU-seconds times the rates of the GPUs' types


def _weighted_gpus() -> ColumnElement[Any]:
    """A row's weighted GPUs; a row from before GPU types were rated counts one per GPU."""
    return func.coalesce(UsageRow.weighted_gpus, func.cardinality(UsageRow.gpu_indices))


def _seconds(since: datetime | None, until: datetime | None) -> ColumnElement[Any]:
    """GPU-seconds of each row clipped to [since, until)."""
    start = func.greatest(UsageRow.start_at, since) if since else UsageRow.start_at
    end = func.least(UsageRow.end_at, until) if until else UsageRow.end_at
    return func.extract("epoch", end - start)


def usage_totals(
    session: Session, by: str, *, tenant: str = "", since: datetime | None = None, until: datetime | None = None
) -> list[UsageTotal]:
    """GPU-seconds grouped by job, tenant, user (with its tenant), UTC day or GPU ("node/index"), over any window."""
    if by not in BY:
        raise InvalidArgument("by", f"unknown grouping {by!r}; one of {', '.join(BY)}")
    where: list[ColumnElement[bool]] = []
    if since:
        where += [UsageRow.end_at > since, UsageRow.hour >= int(since.timestamp() // HOUR_S)]
    if until:
        where += [UsageRow.start_at < until]
    if tenant:
        where.append(UsageRow.tenant == tenant)
    seconds = _seconds(since, until)
    if by == "gpu":
        # Two set-returning calls in one select list run in lockstep (PostgreSQL 10+): each
        # GPU with its own rate; a row without rates pads them with NULL, which counts 1.
        per_gpu = select(
            UsageRow.node, func.unnest(UsageRow.gpu_indices).label("gpu"),
            func.unnest(UsageRow.gpu_rates).label("rate"), seconds.label("s"),
        ).where(*where).subquery()
        rate = func.coalesce(per_gpu.c.rate, UNKNOWN_RATE)
        rows = session.execute(
            select(func.concat(per_gpu.c.node, "/", per_gpu.c.gpu), literal(""), func.sum(per_gpu.c.s),
                   func.sum(per_gpu.c.s * rate))
            .group_by(per_gpu.c.node, per_gpu.c.gpu).order_by(per_gpu.c.node, per_gpu.c.gpu)
        ).all()
    elif by == "user":
        rows = _by_user(session, where, seconds)
    else:
        gpu_seconds = func.sum(seconds * func.cardinality(UsageRow.gpu_indices))
        weighted = func.sum(seconds * _weighted_gpus())
        key: SQLColumnExpression[Any] = {
            "job": UsageRow.job_id,
            "tenant": UsageRow.tenant,
            "day": func.to_char(func.timezone("UTC", UsageRow.start_at), "YYYY-MM-DD"),
        }[by]
        owner = func.min(UsageRow.tenant) if by == "job" else literal("")
        rows = session.execute(
            select(key, owner, gpu_seconds, weighted).where(*where).group_by(key).order_by(key)
        ).all()
    return [UsageTotal(str(k), str(t), Decimal(s), Decimal(w)) for k, t, s, w in rows]


def _by_user(session: Session, where: list[ColumnElement[bool]], seconds: Any) -> list[Any]:
    """Usage per (tenant, user): a job's user is what the cluster recorded at submission."""
    jobs = read_models.cluster_jobs
    user = func.coalesce(jobs.c.submitted_by, NO_USER)
    stmt = (select(user, UsageRow.tenant, func.sum(seconds * func.cardinality(UsageRow.gpu_indices)),
                   func.sum(seconds * _weighted_gpus()))
            .select_from(UsageRow).outerjoin(jobs, jobs.c.job_id == UsageRow.job_id).where(*where)
            .group_by(UsageRow.tenant, user).order_by(UsageRow.tenant, user))
    return list(session.execute(stmt).all())


def capacity(session: Session) -> int:
    """GPUs of the nodes alive now: G of the quota formula."""
    return int(session.execute(select(func.count()).select_from(read_models.cluster_alive_gpus)).scalar_one())


@dataclass(frozen=True)
class TenantReport:
    """One tenant's standing over the window; GPU-seconds, `used` weighted by GPU type (what
    fairness reads), `raw_used` not."""

    tenant: str
    share: float
    quota: int
    entitled: float
    deserved: float
    used: float
    raw_used: float


def _ts(t: datetime) -> float:
    return t.timestamp()


@dataclass(frozen=True)
class Standings:
    at: datetime
    window_start: datetime
    capacity: int
    tenants: list[TenantReport]


def standings(session: Session, cfg: FairnessConfig | None = None, tenant: str = "") -> Standings:
    """Per tenant: quota (of all tenants' shares), then W, D, U over the sliding window."""
    cfg = cfg or FairnessConfig()
    gpus = capacity(session)
    rows = list(session.scalars(select(TenantRow).order_by(TenantRow.name)))
    quota = quotas(gpus, {t.name: t.share for t in rows})
    rows = [t for t in rows if not tenant or t.name == tenant]
    now = db_now(session)
    start = window_start(_ts(now), cfg)
    since = datetime.fromtimestamp(start, UTC)
    demand: dict[str, list[Span]] = defaultdict(list)
    jobs = list(session.execute(_DEMAND_COLUMNS.where(
        cjobs.c.created_at < now, or_(cjobs.c.finished_at.is_(None), cjobs.c.finished_at > since)
    )))
    runnable = _demand_intervals(session, jobs)
    for job in jobs:  # `job.gpus` asked; `gpus` above is G, returned below as the capacity
        demand[job.tenant] += [Span(a, _ts(now) if b is None else b, job.gpus) for a, b in runnable[job.id]]
    running: dict[str, list[Span]] = defaultdict(list)  # weighted GPUs: U is weighted service
    raw: dict[str, list[Span]] = defaultdict(list)
    usage = select(UsageRow.tenant, UsageRow.start_at, UsageRow.end_at, func.cardinality(UsageRow.gpu_indices),
                   _weighted_gpus())
    for name, a, b, n, w in session.execute(usage.where(UsageRow.hour >= int(start // HOUR_S))):
        running[name].append(Span(_ts(a), _ts(b), float(w)))
        raw[name].append(Span(_ts(a), _ts(b), n))
    out = []
    for t in rows:
        born = _ts(t.created_at)
        st = tenant_standing(t.name, quota[t.name], born, _ts(now), demand[t.name], running[t.name], cfg)
        raw_used = used_in_window(born, _ts(now), raw[t.name], cfg)
        out.append(TenantReport(t.name, t.share, st.quota, st.entitled, st.deserved, st.used, raw_used))
    return Standings(now, since, gpus, out)


@dataclass(frozen=True)
class JobReport:
    """One job's long-term fairness: D_j and U_j in GPU-seconds since it arrived (U_j
    weighted by GPU type; `raw_used` is not)."""

    job_id: str
    tenant: str
    state: str
    gpus: int
    submitted: datetime
    deserved: float
    used: float
    pending_since: datetime | None
    raw_used: float = 0.0
    applies: bool = True  # F_j reads as a number (rota.core.fairness.standings.job_fairness_applies)


def job_fairness(session: Session, cfg: FairnessConfig | None = None, tenant: str = "") -> list[JobReport]:
    """Jobs not finished, and those finished within the window, with D_j and U_j."""
    cfg = cfg or FairnessConfig()
    shares = {name: share for name, share in session.execute(select(TenantRow.name, TenantRow.share))}
    quota = quotas(capacity(session), shares)
    now = db_now(session)
    recent = now - timedelta(seconds=cfg.window_s)
    base = _DEMAND_COLUMNS.add_columns(cjobs.c.priority).where(cjobs.c.created_at <= now)
    if tenant:
        base = base.where(cjobs.c.tenant == tenant)
    shown = list(session.execute(base.where(or_(cjobs.c.finished_at.is_(None), cjobs.c.finished_at > recent))))
    if not shown:
        return []
    # Replay every job active at any time since the earliest shown arrival: each changed
    # the others' shares while it was active.
    first = min(j.created_at for j in shown)
    replay = list(session.execute(base.where(or_(cjobs.c.finished_at.is_(None), cjobs.c.finished_at > first))))
    runnable = _demand_intervals(session, replay)
    lives: dict[str, list[JobLife]] = defaultdict(list)
    for j in replay:
        finished = _ts(j.finished_at) if j.finished_at else None
        lives[j.tenant].append(JobLife(j.id, j.gpus, float(j.priority), _ts(j.created_at), finished, runnable[j.id]))
    ids = [j.id for j in shown]
    seconds = _seconds(None, None)
    used_stmt = (
        select(UsageRow.job_id, func.sum(seconds * _weighted_gpus()),
               func.sum(seconds * func.cardinality(UsageRow.gpu_indices)))
        .where(UsageRow.job_id.in_(ids)).group_by(UsageRow.job_id)
    )
    used: dict[str, float] = {}
    raw_used: dict[str, float] = {}
    for k, weighted, plain in session.execute(used_stmt):
        used[k], raw_used[k] = float(weighted), float(plain)
    pending = _pending_since(session, [j.id for j in shown if j.state == jobstate.PENDING])
    per_tenant = {t: job_standings(quota.get(t, 0), js, used, _ts(now)) for t, js in lives.items()}
    out = []
    for j in sorted(shown, key=lambda j: (j.tenant, j.created_at, j.id)):
        st = per_tenant[j.tenant][j.id]
        since = pending.get(j.id, j.created_at) if j.state == jobstate.PENDING else None
        applies = job_fairness_applies(j.state, st.deserved, started=j.started_at is not None or st.used > 0,
                                       held_now=dependencies.held_back(j.reason or ""))
        out.append(JobReport(j.id, j.tenant, j.state, j.gpus, j.created_at, st.deserved, st.used, since,
                             raw_used.get(j.id, 0.0), applies))
    return out


# What a job's intervals of demand are read from (rota.core.fairness.standings.demand_intervals).
_DEMAND_COLUMNS = select(
    cjobs.c.job_id.label("id"), cjobs.c.tenant, cjobs.c.state, cjobs.c.reason, cjobs.c.gpus, cjobs.c.spec,
    cjobs.c.array_capped, cjobs.c.created_at, cjobs.c.started_at, cjobs.c.finished_at,
)


def _demand_intervals(session: Session, jobs: Sequence[Any]) -> dict[str, tuple[tuple[float, float | None], ...]]:
    """Each job's intervals of demand (rota.core.fairness.standings.demand_intervals): the
    tasks of a capped array and the jobs with dependencies are the ones their own
    submission can hold back; PAUSED spells come from the cluster's pause moves."""
    ids = [j.id for j in jobs]
    paused: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    if ids:
        moves = session.execute(
            select(pause_moves.c.job_id, pause_moves.c.from_state, pause_moves.c.to_state, pause_moves.c.at)
            .where(pause_moves.c.job_id.in_(ids)).order_by(pause_moves.c.job_id, pause_moves.c.transition_id)
        )
        for job_id, before, after, at in moves:
            if after == jobstate.PAUSED:
                paused[job_id].append((_ts(at), None))
            elif before == jobstate.PAUSED and paused[job_id] and paused[job_id][-1][1] is None:
                paused[job_id][-1] = (paused[job_id][-1][0], _ts(at))
    out = {}
    for j in jobs:
        holdable = bool(j.array_capped) or bool((j.spec or {}).get("depends_on"))
        out[j.id] = demand_intervals(
            _ts(j.created_at), _ts(j.finished_at) if j.finished_at else None,
            started=_ts(j.started_at) if j.started_at else None, holdable=holdable,
            held_now=j.state == jobstate.PENDING and dependencies.held_back(j.reason or ""), paused=paused[j.id])
    return out


def _pending_since(session: Session, ids: list[str]) -> dict[str, datetime]:
    """When each job last went back to PENDING (a requeue); absent: since it was submitted."""
    if not ids:
        return {}
    stmt = (
        select(read_models.cluster_requeues.c.job_id, read_models.cluster_requeues.c.requeued_at)
        .where(read_models.cluster_requeues.c.job_id.in_(ids))
    )
    return {k: v for k, v in session.execute(stmt)}


# What the allocator's `fair` policy reads (it runs against the same database).
