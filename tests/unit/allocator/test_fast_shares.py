"""`fast` honours tenants' shares when given their standings: run step by step on a saturated
queue (every tenant has more work than the cluster), each tenant's share of the GPU-steps
tends to its quota's share, whatever order the jobs were submitted in; without standings
the queue's order decides (the first tenant submitted drains its queue first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from builders import batch_job, scenario

from rota.core.fairness.ltgf import FairnessConfig, quotas
from rota.core.fairness.twostage import TenantState
from rota.core.planning import policy_fast

STEP_S = 3600  # the scenario's default step
DURATION = 2  # steps per job
CFG = FairnessConfig(lease_s=DURATION * STEP_S)  # a pick is charged what the job will use


def step_jobs(queue: list[tuple[str, str]], started: Mapping[str, tuple[int, int]], now: int) -> list[dict[str, Any]]:
    """The scenario's jobs at step `now`: those started and not finished pinned where they run."""
    jobs = []
    for job_id, tenant in queue:
        if job_id not in started:
            jobs.append(batch_job(job_id, tenant=tenant, duration=DURATION))
        elif started[job_id][0] + DURATION > now:
            at, gpu = started[job_id]
            jobs.append(batch_job(job_id, tenant=tenant, duration=DURATION, running={"started": at - now, "first_gpu": gpu}))
    return jobs


def run(shares: Mapping[str, float], gpus: int, steps: int, with_standings: bool) -> dict[str, float]:
    """Each tenant's fraction of the GPU-steps used over `steps` re-plans; jobs of 1 GPU,
    submitted tenant by tenant (the first tenant's whole queue first)."""
    per_tenant = gpus * steps // DURATION + gpus  # more than the cluster can run in `steps`
    queue = [(f"{t}{i}", t) for t in shares for i in range(per_tenant)]
    tenant_of = dict(queue)
    quota = quotas(gpus, dict(shares))
    started: dict[str, tuple[int, int]] = {}  # job -> (step, GPU)
    used = dict.fromkeys(shares, 0)
    for now in range(steps):
        held = dict.fromkeys(shares, 0)
        for job_id, (at, _) in started.items():
            held[tenant_of[job_id]] += at + DURATION > now
        standings = {t: TenantState(t, quota[t], held[t], used[t] * STEP_S, quota[t] * now * STEP_S, shares[t])
                     for t in shares}
        s = scenario(*step_jobs(queue, started, now), gpus=gpus, horizon=6)
        grid = policy_fast.plan(s, standings=standings if with_standings else None, cfg=CFG).grid
        for g, row in enumerate(grid):
            if row[0] is not None:
                started.setdefault(row[0], (now, g))
                used[tenant_of[row[0]]] += 1
    total = sum(used.values())
    return {t: used[t] / total for t in shares}


@pytest.mark.parametrize(("shares", "gpus"), [
    ({"a": 1, "b": 1, "c": 3}, 16),  # quotas 3, 3, 9: c deserves 3/5
    ({"c": 3, "a": 1, "b": 1}, 16),  # the big tenant submitted first
    ({"a": 1, "b": 1, "c": 1}, 8),   # quotas 2, 2, 2 (2 GPUs no one's): a third each
    ({"a": 1, "b": 3}, 8),           # quotas 2, 6
])
def test_fast_with_standings_gives_each_tenant_its_quotas_share_of_gpu_time(
    shares: dict[str, float], gpus: int
) -> None:
    got = run(shares, gpus, steps=24, with_standings=True)
    quota = quotas(gpus, shares)
    for t in shares:
        assert got[t] == pytest.approx(quota[t] / sum(quota.values()), abs=0.05), (t, got)


def test_fast_without_standings_serves_the_queue_in_submission_order() -> None:
    """The trap the standings remove: the share-3 tenant, submitted last, gets nothing."""
    got = run({"a": 1, "b": 1, "c": 3}, 16, steps=24, with_standings=False)
    assert got["a"] > 0.9 and got["c"] == 0.0, got


def test_within_a_tenant_fast_keeps_its_own_order() -> None:
    """Interleaving tenants never reorders one tenant's jobs: a high-priority job of a tenant
    still goes before that tenant's normal ones."""
    s = scenario(
        batch_job("a1", tenant="a"), batch_job("a2", tenant="a", priority=9),
        batch_job("b1", tenant="b"), batch_job("b2", tenant="b"), gpus=2, horizon=4,
    )
    standings = {t: TenantState(t, 1, 0, 0.0, 0.0) for t in ("a", "b")}
    grid = policy_fast.plan(s, standings=standings).grid
    step0 = {row[0] for row in grid}
    assert step0 == {"a2", "b1"}
