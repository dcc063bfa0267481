"""The ledger's answers as plain dataclasses: GPU-hours used, tenant standings, job fairness.

GPU time is in GPU-hours throughout; F = used / deserved, below 1 means under-served, and
None ("n/a") where it does not apply: a tenant without demand in the window, a job that
never demanded, is not runnable now (paused, held by its array's cap or a dependency) or
ended without starting (docs/operators.md, "What F means"). Weighted GPU-hours are GPU-hours times the rate of each GPU's
type (A100 = 1, an unknown type 1; the ledger's ROTA_GPU_TYPE_RATES): `used` and F count
them, `raw_used` and `gpu_hours` do not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from rota.client import _wire
from rota.client.enums import JobState
from rota.v1 import ledger_pb2

BY = ("job", "tenant", "day", "gpu")


def _from_unix(seconds: int) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def to_unix(t: datetime | None) -> int:
    """Seconds since the epoch; a naive datetime is read as UTC (the ledger's clock)."""
    if t is None:
        return 0
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp())


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _applies(fairness: float) -> float | None:
    """The ledger sends NaN where F does not apply."""
    return None if math.isnan(fairness) else fairness


def fairness_text(fairness: float | None, digits: int = 3) -> str:
    """F as the CLI and the console show it: "n/a" where it does not apply."""
    return "n/a" if fairness is None else f"{fairness:.{digits}f}"


def _or_raw(weighted: float, raw: float) -> float:
    """A weighted figure, or the raw one from a ledger before 0.2.0, which sends no weighted
    figure (0) and charged one per GPU. A current ledger's weighted figure is never 0 where
    the raw one is not: every rate is positive."""
    return weighted if weighted or not raw else raw


@dataclass(frozen=True)
class UsageEntry:
    key: str  # a job id, tenant, UTC day (YYYY-MM-DD) or GPU (node/index)
    gpu_hours: float  # raw
    tenant: str  # the job's tenant when grouped by job or tenant, else ""
    weighted_gpu_hours: float = 0.0  # by the rates of the GPUs' types

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def _from_proto(r: ledger_pb2.UsageRow) -> UsageEntry:
        return UsageEntry(r.key, r.gpu_hours, r.tenant, _or_raw(r.weighted_gpu_hours, r.gpu_hours))


@dataclass(frozen=True)
class TenantFairness:
    tenant: str
    share: float
    quota: int  # GPUs
    entitled: float  # GPU-hours over the window
    deserved: float
    used: float  # weighted GPU-hours
    fairness: float | None  # None: n/a (no demand in the window)
    raw_used: float = 0.0  # GPU-hours, not weighted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def _from_proto(t: ledger_pb2.TenantStanding) -> TenantFairness:
        return TenantFairness(t.tenant, t.share, int(t.quota), t.entitled, t.deserved, t.used, _applies(t.fairness),
                              _or_raw(t.raw_used, t.used))


@dataclass(frozen=True)
class Standings:
    """Tenant standings over the sliding window [window_start, at)."""

    tenants: list[TenantFairness]
    capacity_gpus: int
    window_start: datetime | None
    at: datetime | None
    # The policy deciding who gets GPUs (fifo | fast | fair; "" when the ledger does not
    # say) and, under fair, its lease in seconds (else 0).
    policy: str = ""
    lease_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "lease_seconds": self.lease_seconds,
            "capacity_gpus": self.capacity_gpus, "window_start": _iso(self.window_start), "at": _iso(self.at),
            "tenants": [t.to_dict() for t in self.tenants],
        }

    @staticmethod
    def _from_proto(r: ledger_pb2.StandingsResponse) -> Standings:
        return Standings(
            [TenantFairness._from_proto(t) for t in r.tenants], r.capacity_gpus,
            _from_unix(r.window_start_unix), _from_unix(r.at_unix), r.policy, r.lease_seconds,
        )


# What each policy does with the tenants' shares, as `rota fairness` says it.
POLICY_EFFECT = {
    "fair": "over-share tenants' preemptible jobs yield their GPUs at lease expiry",
    "fast": "waiting jobs go to the tenant furthest below its share first; nothing is preempted for shares",
    "fifo": "arrival order; shares are not used",
}


def policy_text(policy: str, lease_seconds: float) -> str:
    """`policy: fair (lease 30m): ...`: which policy decides and what it does with shares."""
    if not policy:
        return "policy: unknown (the ledger does not say)"
    lease = f" (lease {_span(lease_seconds)})" if policy == "fair" and lease_seconds > 0 else ""
    effect = POLICY_EFFECT.get(policy)
    return f"policy: {policy}{lease}" + (f": {effect}" if effect else "")


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class JobFairness:
    job_id: str
    tenant: str
    state: JobState
    gpus: int
    deserved: float  # GPU-hours since it arrived
    used: float  # weighted GPU-hours
    fairness: float | None  # None: n/a (see the module's docstring)
    pending_since: datetime | None
    raw_used: float = 0.0  # GPU-hours, not weighted

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pending_since": _iso(self.pending_since)}

    @staticmethod
    def _from_proto(j: ledger_pb2.JobFairness) -> JobFairness:
        return JobFairness(
            j.job_id, j.tenant, _wire.job_state(j.job_state), j.gpus, j.deserved, j.used, _applies(j.fairness), _from_unix(j.pending_since_unix),
            _or_raw(j.raw_used, j.used),
        )
