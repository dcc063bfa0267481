"""Quotas in a live re-plan (plan_live): a limit holds a job with its reason, a guarantee
reclaims a borrower's job, under the `fast` and `fair` policies."""

from __future__ import annotations

import pytest

from rota.core.fairness.quotas import Quota
from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode
from rota.core.planning.moves import MoveCost, MoveInputs
from rota.core.planning.planner import plan_live

NODES = [LiveNode("n1", 4), LiveNode("n2", 4)]
H = Horizon(step_s=60, steps=8, now_s=1_000_000.0)
QUOTAS = {"vision": Quota("vision", guaranteed=4, limit=6), "nlp": Quota("nlp", guaranteed=4, limit=8)}


def job(job_id: str, tenant: str, gpus: int, node: str | None = None, first: int = 0, **kw: object) -> LiveJob:
    where = {"node": node, "gpu_indices": tuple(range(first, first + gpus)), "elapsed_s": 30.0} if node else {}
    return LiveJob(job_id, tenant, "training", 10, gpus, preemptible=True, duration_s=3600.0,
                   **where, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["fast", "fair"])
def test_limit_holds_a_job_with_its_reason(policy: str) -> None:
    jobs = [job("v1", "vision", 4, "n1"), job("v2", "vision", 4)]
    out = plan_live(NODES, jobs, H, policy, quotas=QUOTAS)
    assert "v2" not in {s.job_id for s in out.decision.starts}
    assert out.decision.waiting["v2"].startswith("waits: tenant vision at its limit 6")
    # Without quotas the free node takes it.
    assert "v2" in {s.job_id for s in plan_live(NODES, jobs, H, policy).decision.starts}


@pytest.mark.parametrize("policy", ["fast", "fair"])
def test_owner_within_guarantee_reclaims_a_borrower(policy: str) -> None:
    # vision borrows: 6 of 8 GPUs against a guarantee of 4; nlp's 4-GPU job is within its own.
    borrowers = [job("v1", "vision", 4, "n1"), job("v2", "vision", 2, "n2"), job("v3", "vision", 2, "n2", first=2)]
    # v1's checkpoint is the dearest: the two small jobs on n2 go instead (checkpoint-priced).
    costs = {j.id: MoveCost(50.0 if j.id == "v1" else 5.0, 10.0) for j in borrowers}
    quotas = {**QUOTAS, "vision": Quota("vision", guaranteed=4, limit=8)}
    out = plan_live(NODES, [*borrowers, job("n1", "nlp", 4)], H, policy, moves=MoveInputs(costs=costs), quotas=quotas)
    assert {r.job_id for r in out.reclaims} == {"v2", "v3"}
    assert all(r.for_job == "n1" and "reclaims" in r.reason for r in out.reclaims)


def test_no_reclaim_without_a_checkpoint_image() -> None:
    borrowers = [job("v1", "vision", 4, "n1"), job("v2", "vision", 4, "n2")]
    quotas = {**QUOTAS, "vision": Quota("vision", guaranteed=0, limit=8)}
    out = plan_live(NODES, [*borrowers, job("n1", "nlp", 4)], H, "fast", quotas=quotas)
    assert out.reclaims == []
