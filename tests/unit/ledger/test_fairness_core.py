"""LTGF accounting (docs/design.md §4) on cases worked out by hand."""

from __future__ import annotations

import random

import pytest

from rota.core.fairness.ltgf import (
    FairnessConfig,
    HourlyWindow,
    JobShareClock,
    TenantAccount,
    jain,
    quotas,
    ratio,
)

H = 3600.0


@pytest.mark.parametrize(
    ("gpus", "shares", "expected"),
    [
        (8, {"a": 1, "b": 1}, {"a": 4, "b": 4}),
        (10, {"a": 1, "b": 2}, {"a": 3, "b": 6}),  # 3.33 and 6.67 round down; 1 GPU is nobody's
        (8, {"a": 0.3, "b": 0.3}, {"a": 4, "b": 4}),  # float noise does not lose a GPU
        (8, {"a": 0, "b": 0}, {"a": 0, "b": 0}),
    ],
)
def test_quota_is_the_floor_of_the_proportional_share(
    gpus: int, shares: dict[str, float], expected: dict[str, int]
) -> None:
    assert quotas(gpus, shares) == expected


def test_fairness_is_one_when_nothing_was_deserved() -> None:
    assert ratio(5.0, 0.0) == 1.0
    assert ratio(5.0, 10.0) == 0.5


def test_jain_index_is_one_for_equal_values_and_one_over_n_for_a_monopoly() -> None:
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([1.0, 0.5]) == pytest.approx(0.9)


def test_window_splits_a_span_at_hour_boundaries() -> None:
    w = HourlyWindow()
    w.add(0.5 * H, 2.25 * H, (4.0, 2.0, 1.0))
    assert w.buckets[0] == pytest.approx([2 * H, 1 * H, 0.5 * H])
    assert w.buckets[1] == pytest.approx([4 * H, 2 * H, 1 * H])
    assert w.buckets[2] == pytest.approx([1 * H, 0.5 * H, 0.25 * H])


def test_window_forgets_buckets_older_than_24_hours() -> None:
    w = HourlyWindow()
    w.add(0.0, 30 * H, (1.0, 1.0, 1.0))
    # At t = 30.5 h the window is buckets 7..30 (24 of them); bucket 30 holds nothing yet.
    assert w.totals(30.5 * H) == pytest.approx((23 * H, 23 * H, 23 * H))
    assert len(w.buckets) <= 25
    w.add(30 * H, 30.5 * H, (1.0, 1.0, 1.0))
    assert w.totals(30.5 * H) == pytest.approx((23.5 * H, 23.5 * H, 23.5 * H))


def test_tenant_account_accrues_entitled_deserved_and_used() -> None:
    # Q = 4. For 1 h demand 6 with 3 running, then 1 h demand 2 with 2 running.
    acct = TenantAccount("a", quota=4)
    acct.set_load(0.0, demand=6, running=3)
    acct.set_load(H, demand=2, running=2)
    st = acct.standing(2 * H)
    assert (st.entitled, st.deserved, st.used) == pytest.approx((8 * H, (4 + 2) * H, (3 + 2) * H))
    assert st.fairness == pytest.approx(5 / 6)


def test_idle_tenant_is_entitled_but_deserves_nothing_so_its_fairness_is_one() -> None:
    acct = TenantAccount("a", quota=4, cfg=FairnessConfig())
    st = acct.standing(3 * H)
    assert (st.entitled, st.deserved, st.fairness) == (12 * H, 0.0, 1.0)


def test_job_share_splits_the_quota_by_weight_capped_at_the_jobs_own_gpus() -> None:
    # Q = 4. j1 (1 GPU, w 1) from 0; j2 (4 GPUs, w 1) from 100; j2 leaves at 300.
    # [0,100): j1 alone, share 4, capped at 1   -> j1 += 100
    # [100,300): share 2 each: j1 min(1,2)=1 -> +200; j2 min(4,2)=2 -> +400
    # [300,400): j1 alone again                 -> +100
    c = JobShareClock(quota=4)
    c.add(0.0, "j1", gpus=1)
    c.add(100.0, "j2", gpus=4)
    assert c.remove(300.0, "j2") == pytest.approx(400.0)
    assert c.deserved(400.0, "j1") == pytest.approx(400.0)


def test_job_share_weights_follow_priorities() -> None:
    # Q = 6, weights 1 and 2: shares 2 and 4, both jobs want 8 GPUs.
    c = JobShareClock(quota=6)
    c.add(0.0, "low", gpus=8, weight=1)
    c.add(0.0, "high", gpus=8, weight=2)
    assert c.deserved(10.0, "low") == pytest.approx(20.0)
    assert c.deserved(10.0, "high") == pytest.approx(40.0)


def test_job_share_clock_matches_a_step_by_step_sum() -> None:
    rng = random.Random(7)
    q = 5
    jobs = []
    for i in range(30):
        start = rng.uniform(0, 100)
        jobs.append(
            (f"j{i}", rng.choice([1, 2, 4, 8]), rng.choice([1, 2]), start, start + rng.uniform(1, 50))
        )
    events = sorted(
        [(s, 1, k) for k, (_, _, _, s, _) in enumerate(jobs)]
        + [(e, 0, k) for k, (_, _, _, _, e) in enumerate(jobs)]
    )
    c = JobShareClock(quota=q)
    got: dict[str, float] = {}
    for t, arrive, k in events:
        name, n, w, _, _ = jobs[k]
        if arrive:
            c.add(t, name, n, w)
        else:
            got[name] = c.remove(t, name)
    # Brute force: integrate in small steps.
    dt = 0.01
    for name, n, w, s, e in jobs:
        total, t = 0.0, s
        while t < e:
            mid = t + min(dt, e - t) / 2
            weights = sum(w2 for _, _, w2, s2, e2 in jobs if s2 <= mid < e2)
            total += min(n, w * q / weights) * min(dt, e - t)
            t += dt
        assert got[name] == pytest.approx(total, rel=2e-3), name
