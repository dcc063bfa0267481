"""The simulator: hand-computed schedules and invariants every policy must keep."""

from __future__ import annotations

import random

import pytest

from rota.core.fairness.ltgf import FairnessConfig
from rota.sim.engine import SimConfig, Simulator
from rota.sim.orderings import POLICIES
from rota.sim.workload import Job


def run(
    jobs: list[Job], shares: dict[str, float], policy: str, gpus: int, gpn: int = 8, **kw: float
) -> dict[str, list[list[float]]]:
    cfg = SimConfig(gpus, gpn, **kw)  # type: ignore[arg-type]
    return {r.job.id: r.intervals for r in Simulator(jobs, shares, cfg, POLICIES[policy]()).run()}


def test_fifo_starts_jobs_in_arrival_order_and_the_head_blocks_the_rest() -> None:
    jobs = [
        Job("big", "a", 0, 100, 2),
        Job("wide", "a", 10, 50, 2),  # waits for big
        Job("small", "a", 20, 10, 1),  # would fit nowhere anyway, and must not pass `wide`
    ]
    got = run(jobs, {"a": 1}, "fifo", gpus=2, gpn=2)
    assert got == {"big": [[0, 100]], "wide": [[100, 150]], "small": [[150, 160]]}


def test_sjf_runs_the_shortest_waiting_job_first() -> None:
    jobs = [Job("hog", "a", 0, 100, 1), Job("long", "a", 1, 50, 1), Job("short", "a", 2, 5, 1)]
    got = run(jobs, {"a": 1}, "sjf", gpus=1, gpn=1)
    assert got == {"hog": [[0, 100]], "short": [[100, 105]], "long": [[105, 155]]}


def test_fair_makes_a_borrower_yield_at_lease_expiry_with_checkpoint_and_resume_costs() -> None:
    # Q = 1 each. Tenant a borrows both GPUs; b arrives at 100. At 1800 a's leases
    # expire: a keeps one (tie on the 20% rule broken by name, a1 older), b takes the
    # other after a2's 5 s checkpoint; a2 resumes when b1 ends, paying 20 s to restore.
    jobs = [Job("a1", "a", 0, 10000, 1), Job("a2", "a", 0, 10000, 1), Job("b1", "b", 100, 1000, 1)]
    got = run(jobs, {"a": 1, "b": 1}, "fair", gpus=2, gpn=2)
    assert got == {
        "a1": [[0, 10000]],
        "a2": [[0, 1805], [2805, 2805 + 20 + 8200]],
        "b1": [[1805, 2805]],
    }


def test_fair_lets_a_job_wider_than_its_tenants_whole_quota_displace_a_borrower() -> None:
    # 4 GPUs, shares 3:1: Q_a = 3, Q_b = 1. a borrows all four; b's 2-GPU job can never fit
    # within b's quota, and b holds nothing, so at a's lease expiry it takes two of a's GPUs
    # instead of waiting for the starvation threshold (4 h, past the end of this run).
    jobs = [Job(f"a{k}", "a", 0, 5000, 1) for k in range(4)] + [Job("b1", "b", 100, 1000, 2)]
    got = run(jobs, {"a": 3, "b": 1}, "fair", gpus=4, gpn=4)
    assert got["b1"] == [[1805, 2805]]
    assert sum(len(v) - 1 for v in got.values()) == 2  # two of a's jobs paused, once each


def test_fair_never_preempts_a_tenant_within_its_quota_for_another_tenant() -> None:
    # b's new job never takes a's GPU (a is within its quota); it takes b's own: b1 yields
    # at the first lease expiry after its first GPU-hour (twostage.own_yields).
    jobs = [Job("a1", "a", 0, 10000, 1), Job("b1", "b", 0, 10000, 1), Job("b2", "b", 100, 1000, 1)]
    got = run(jobs, {"a": 1, "b": 1}, "fair", gpus=2, gpn=2)
    assert got["a1"] == [[0, 10000]]
    (b2,) = got["b2"]
    assert len(got["b1"]) == 2 and got["b1"][0][1] <= b2[0] and b2[1] <= got["b1"][1][0]


def test_fair_reserves_a_block_for_a_starving_wide_job() -> None:
    # A stream of 1-GPU jobs would keep one of the two GPUs busy forever; after 4 h of
    # waiting the 2-GPU job gets the block drained for it.
    cfg = FairnessConfig(starvation_s=3600.0)
    jobs = [Job(f"s{i}", "a", i * 500.0, 900.0, 1) for i in range(40)] + [Job("wide", "b", 10.0, 100.0, 2)]
    sim = Simulator(jobs, {"a": 1, "b": 1}, SimConfig(2, 2, cfg), POLICIES["fair"]())
    runs = {r.job.id: r for r in sim.run()}
    assert runs["wide"].intervals[0][0] < 3600 + 2 * 1800


def _random_trace(seed: int, n: int = 60) -> list[Job]:
    rng = random.Random(seed)
    return [
        Job(
            f"j{i}",
            rng.choice("abc"),
            rng.uniform(0, 20000),
            rng.uniform(60, 9000),
            rng.choice([1, 1, 2, 4, 8]),
            rng.choice([1, 2]),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("seed", [1, 2])
def test_schedules_keep_the_invariants(policy: str, seed: int) -> None:
    ck, rs = 5.0, 20.0
    jobs = _random_trace(seed)
    shares = {"a": 3, "b": 2, "c": 1}
    cfg = SimConfig(16, 8, FairnessConfig(lease_s=900.0), ck, rs)
    sim = Simulator(jobs, shares, cfg, POLICIES[policy]())
    runs = sim.run()
    for r in runs:
        ivs = r.intervals
        assert ivs and ivs[0][0] >= r.job.submit_s
        assert r.end_s == ivs[-1][1]
        for (_, a1), (b0, _) in zip(ivs, ivs[1:], strict=False):
            assert a1 <= b0  # one job runs in one place at a time
        k = len(ivs) - 1
        assert sum(b - a for a, b in ivs) == pytest.approx(r.job.duration_s + k * (ck + rs), abs=1e-6)
    # Total GPUs in use never exceeds the cluster (checked at every interval start).
    spans = [(a, b, r.gpus) for r in runs for a, b in r.intervals]
    for t, _, _ in spans:
        assert sum(n for a, b, n in spans if a <= t < b) <= 16


@pytest.mark.parametrize("policy", ["sjf", "las", "drf", "ftf", "fair"])
def test_greedy_policies_leave_no_gpu_idle_while_a_one_gpu_job_waits(policy: str) -> None:
    rng = random.Random(3)
    jobs = [Job(f"j{i}", rng.choice("ab"), rng.uniform(0, 5000), rng.uniform(60, 3000), 1) for i in range(40)]
    runs = Simulator(jobs, {"a": 1, "b": 1}, SimConfig(4, 4), POLICIES[policy]()).run()
    spans = [(a, b) for r in runs for a, b in r.intervals]
    for t in sorted({x for ab in spans for x in ab}):
        running = sum(1 for a, b in spans if a <= t < b)
        waiting = sum(
            1 for r in runs if r.job.submit_s <= t < r.end_s and not any(a <= t < b for a, b in r.intervals)
        )
        assert waiting == 0 or running == 4, (t, running, waiting)


def test_jobs_too_wide_for_the_cluster_or_of_unknown_tenants_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be placed"):
        Simulator([Job("x", "a", 0, 1, 16)], {"a": 1}, SimConfig(8), POLICIES["fifo"]())
    with pytest.raises(ValueError, match="not in the tenants file"):
        Simulator([Job("x", "zz", 0, 1, 1)], {"a": 1}, SimConfig(8), POLICIES["fifo"]())
