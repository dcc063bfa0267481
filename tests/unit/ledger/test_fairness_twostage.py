"""The two-stage choice (tenant, then job) on cases worked out by hand."""

from __future__ import annotations

from dataclasses import dataclass

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.twostage import (
    JobView,
    TenantState,
    fair_job_key,
    fair_tenant_key,
    may_displace,
    tenant_walk,
)

CFG = FairnessConfig()


@dataclass(frozen=True)
class J:
    id: str
    tenant: str
    gpus: int


def tenant(name: str, quota: int, allocated: int, used: float, entitled: float) -> TenantState:
    return TenantState(name, quota, allocated, used, entitled)


def job(
    id: str,
    *,
    used: float = 0.0,
    deserved: float = 100.0,
    pending_since: float | None = 0.0,
    submit: float = 0.0,
) -> JobView:
    return JobView(id, "a", 1, submit, used, deserved, pending_since)


def test_a_tenant_under_20_percent_of_its_quota_goes_before_a_lower_usage_ratio() -> None:
    low = tenant("low", quota=10, allocated=1, used=900.0, entitled=1000.0)  # 10% of quota held
    thrifty = tenant("thrifty", quota=10, allocated=5, used=100.0, entitled=1000.0)
    assert fair_tenant_key(low, CFG) < fair_tenant_key(thrifty, CFG)


def test_among_tenants_under_20_percent_the_lowest_ratio_goes_first() -> None:
    a = tenant("a", quota=10, allocated=1, used=0.0, entitled=1.0)
    b = tenant("b", quota=10, allocated=0, used=0.0, entitled=1.0)
    assert fair_tenant_key(b, CFG) < fair_tenant_key(a, CFG)


def test_otherwise_the_lowest_used_over_entitled_goes_first() -> None:
    a = tenant("a", quota=10, allocated=5, used=600.0, entitled=1000.0)
    b = tenant("b", quota=4, allocated=4, used=300.0, entitled=400.0)
    assert fair_tenant_key(a, CFG) < fair_tenant_key(b, CFG)  # 0.6 < 0.75


def test_a_job_may_displace_within_quota_or_when_wider_than_an_empty_tenants_quota() -> None:
    assert may_displace(holding=2, quota=4, gpus=2) and not may_displace(holding=3, quota=4, gpus=2)
    assert may_displace(holding=0, quota=1, gpus=2)  # could never fit within its quota
    assert not may_displace(holding=1, quota=1, gpus=2)  # holds GPUs already: no second exception


def test_starving_jobs_still_owed_go_first_oldest_first_then_ascending_job_fairness() -> None:
    now = 10 * 3600.0
    jobs = [
        job("fresh-underserved", used=0.0, pending_since=now - 60),
        job("starving-young", used=50.0, pending_since=now - 5 * 3600),
        job("starving-old", used=90.0, pending_since=now - 6 * 3600),
        job("running-served", used=100.0, pending_since=None),
        job("running-overserved", used=300.0, pending_since=None),
        # Waited longest, but has had its due (F_j = 5): not starving, it waits by its F_j.
        job("waited-but-served", used=500.0, pending_since=now - 7 * 3600),
    ]
    order = [j.id for j in sorted(jobs, key=lambda j: fair_job_key(j, now, CFG))]
    assert order == [
        "starving-old",
        "starving-young",
        "fresh-underserved",
        "running-served",
        "running-overserved",
        "waited-but-served",
    ]


def test_walk_charges_each_pick_and_lets_the_other_tenant_go_next() -> None:
    # Quota 2, each holds 1 (50%, so the U/W rule applies): a at 0.5, b at 0.6.
    # a gets a1, charged 1 GPU x 100 s: (50 + 100) / 100 = 1.5 > 0.6, so b gets b1 and
    # rises to 1.6 > 1.5, so a gets a2, then b gets b2.
    tenants = {"a": tenant("a", 2, 1, 50.0, 100.0), "b": tenant("b", 2, 1, 60.0, 100.0)}
    jobs = {"a": [J("a1", "a", 1), J("a2", "a", 1)], "b": [J("b1", "b", 1), J("b2", "b", 1)]}
    placed = tenant_walk(
        tenants, lambda t: jobs[t], lambda t: fair_tenant_key(t, CFG), lambda j: True, charge_s=100.0
    )
    assert [j.id for j in placed] == ["a1", "b1", "a2", "b2"]


def test_walk_skips_jobs_that_do_not_fit_and_stops_when_full() -> None:
    free = [3]

    def fits(j: J) -> bool:
        if j.gpus > free[0]:
            return False
        free[0] -= j.gpus
        return True

    tenants = {"a": tenant("a", 4, 0, 0.0, 1.0), "b": tenant("b", 4, 0, 0.0, 1.0)}
    jobs = {"a": [J("a-big", "a", 4), J("a-small", "a", 1)], "b": [J("b1", "b", 2), J("b2", "b", 2)]}
    placed = tenant_walk(
        tenants, lambda t: jobs[t], lambda t: fair_tenant_key(t, CFG), fits, 1800.0, lambda: free[0] == 0
    )
    assert [j.id for j in placed] == ["a-small", "b1"]
