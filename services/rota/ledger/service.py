"""gRPC adapter of the ledger: protos in, repository calls in worker threads, protos out.

A tenant token sees only its own tenant (its filter is forced, as in the api's ListJobs);
the admin token sees all and alone may record usage. `used` and F count GPU-hours weighted
by GPU type (`rates`); Usage answers raw and weighted GPU-hours side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import grpc
from sqlalchemy.orm import Session

from rota.common import convert
from rota.common.auth import current_identity
from rota.common.db import Database
from rota.core.errors import InvalidArgument
from rota.core.fairness.ltgf import FairnessConfig, ratio
from rota.core.fairness.rates import DEFAULT_RATES, GpuRates
from rota.ledger import repository
from rota.ledger.models import HOUR_S
from rota.ledger.repository import UsageRecord
from rota.v1 import ledger_pb2, ledger_pb2_grpc

T = TypeVar("T")
MS_PER_HOUR = HOUR_S * 1000


def _hours(gpu_seconds: float) -> float:
    return gpu_seconds / HOUR_S


def _unix(t: datetime | None) -> int:
    return int(t.timestamp()) if t is not None else 0


def record_from_proto(r: ledger_pb2.RecordUsageRequest) -> UsageRecord:
    """Validates a RecordUsage request, naming the first bad field."""
    for name, value, limit in (("lease_id", r.lease_id, 64), ("job_id", r.job_id, 32),
                               ("tenant", r.tenant, 64), ("node", r.node, 64)):
        if not value or len(value) > limit:
            raise InvalidArgument(name, f"required, at most {limit} characters")
    if r.sequence < 0:
        raise InvalidArgument("sequence", f"must not be negative, got {r.sequence}")
    if not r.gpus or len(set(r.gpus)) != len(r.gpus) or min(r.gpus) < 0:
        raise InvalidArgument("gpus", "one or more distinct GPU indices are required")
    if not 0 < r.start_unix_ms <= MAX_UNIX * 1000 - MS_PER_HOUR:
        raise InvalidArgument("start_unix_ms", "required (milliseconds since the epoch, before the year 9999)")
    if r.end_unix_ms < r.start_unix_ms:
        raise InvalidArgument("end_unix_ms", "must not be before start_unix_ms")
    if r.end_unix_ms > (r.start_unix_ms // MS_PER_HOUR + 1) * MS_PER_HOUR:
        raise InvalidArgument("end_unix_ms", "a usage row lies within one UTC hour; split the lease at hour boundaries")
    start = datetime.fromtimestamp(r.start_unix_ms / 1000, UTC)
    end = datetime.fromtimestamp(r.end_unix_ms / 1000, UTC)
    return UsageRecord(r.lease_id, r.sequence, r.job_id, r.tenant, r.node, list(r.gpus), start, end)


MAX_UNIX = 253402300799  # 9999-12-31T23:59:59Z, the last time a datetime holds


def _window(since_unix: int, until_unix: int) -> tuple[datetime | None, datetime | None]:
    if not 0 <= since_unix <= MAX_UNIX:
        raise InvalidArgument("since_unix", f"must be a time between 1970 and 9999, got {since_unix}")
    if not 0 <= until_unix <= MAX_UNIX or (until_unix and until_unix <= since_unix):
        raise InvalidArgument("until_unix", "must be after since_unix (or 0: unbounded)")
    since = datetime.fromtimestamp(since_unix, UTC) if since_unix else None
    until = datetime.fromtimestamp(until_unix, UTC) if until_unix else None
    return since, until


# F where it does not apply (docs/operators.md, "What F means"): NaN on the wire, which the
# SDK reads as None and the CLI and console show as "n/a". A tenant's F applies when it
# had demand in the window (D > 0); a job's by rota.core.fairness.standings.job_fairness_applies.
NOT_APPLICABLE = float("nan")


def tenant_fairness(used: float, deserved: float) -> float:
    return ratio(used, deserved) if deserved > 0 else NOT_APPLICABLE


def _tenant_filter(requested: str) -> str:
    identity = current_identity()
    return requested if identity.is_admin else identity.tenant


class LedgerService(ledger_pb2_grpc.LedgerServiceServicer):
    def __init__(self, db: Database, cfg: FairnessConfig | None = None, rates: GpuRates = DEFAULT_RATES, *,
                 policy: str = "fast", lease_s: float = 0.0) -> None:
        self.db = db
        self.cfg = cfg or FairnessConfig()
        self.rates = rates
        # The cluster's policy (its ROTA_POLICY, which the allocator plans by), for `rota fairness`.
        self.policy, self.lease_s = policy, lease_s if policy == "fair" else 0.0

    async def _tx(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.db.run, fn)

    async def RecordUsage(
        self, request: ledger_pb2.RecordUsageRequest, context: grpc.aio.ServicerContext
    ) -> ledger_pb2.RecordUsageResponse:
        current_identity().require_admin()
        record = record_from_proto(request)
        # Acknowledged only after its SERIALIZABLE commit (run again on a serialization failure).
        recorded = await asyncio.to_thread(self.db.run_serializable, lambda s: repository.record_usage(s, record, self.rates))
        return ledger_pb2.RecordUsageResponse(recorded=recorded)

    async def Usage(self, request: ledger_pb2.UsageRequest, context: grpc.aio.ServicerContext) -> ledger_pb2.UsageResponse:
        tenant = _tenant_filter(request.tenant)
        by = request.by or "tenant"
        if by not in repository.BY:
            raise InvalidArgument("by", f"unknown grouping {by!r}; one of {', '.join(repository.BY)}")
        since, until = _window(request.since_unix, request.until_unix)
        rows = await self._tx(lambda s: repository.usage_totals(s, by, tenant=tenant, since=since, until=until))
        return ledger_pb2.UsageResponse(
            rows=[
                ledger_pb2.UsageRow(
                    key=r.key, gpu_hours=_hours(float(r.gpu_seconds)), tenant=r.tenant,
                    weighted_gpu_hours=_hours(float(r.weighted_gpu_seconds)),
                )
                for r in rows
            ]
        )

    async def Standings(
        self, request: ledger_pb2.StandingsRequest, context: grpc.aio.ServicerContext
    ) -> ledger_pb2.StandingsResponse:
        tenant = _tenant_filter(request.tenant)
        st = await self._tx(lambda s: repository.standings(s, self.cfg, tenant))
        return ledger_pb2.StandingsResponse(
            tenants=[
                ledger_pb2.TenantStanding(
                    tenant=t.tenant, quota=t.quota, entitled=_hours(t.entitled), deserved=_hours(t.deserved),
                    used=_hours(t.used), fairness=tenant_fairness(t.used, t.deserved), share=t.share,
                    raw_used=_hours(t.raw_used),
                )
                for t in st.tenants
            ],
            capacity_gpus=st.capacity, window_start_unix=_unix(st.window_start), at_unix=_unix(st.at),
            policy=self.policy, lease_seconds=self.lease_s,
        )

    async def FairnessIndex(
        self, request: ledger_pb2.FairnessIndexRequest, context: grpc.aio.ServicerContext
    ) -> ledger_pb2.FairnessIndexResponse:
        tenant = _tenant_filter(request.tenant)
        jobs = await self._tx(lambda s: repository.job_fairness(s, self.cfg, tenant))
        return ledger_pb2.FairnessIndexResponse(
            jobs=[
                ledger_pb2.JobFairness(
                    job_id=j.job_id, tenant=j.tenant, deserved=_hours(j.deserved), used=_hours(j.used),
                    fairness=ratio(j.used, j.deserved) if j.applies else NOT_APPLICABLE, gpus=j.gpus,
                    job_state=convert.state_value(j.state),
                    pending_since_unix=_unix(j.pending_since), submitted_unix_seconds=j.submitted.timestamp(),
                    pending_since_unix_seconds=j.pending_since.timestamp() if j.pending_since is not None else 0.0,
                    raw_used=_hours(j.raw_used),
                )
                for j in jobs
            ]
        )
