"""Summary figures recomputed from intervals, on a schedule worked out by hand."""

from __future__ import annotations

import pytest

from rota.sim.engine import SimConfig, Simulator
from rota.sim.metrics import JobRecord, job_fairness, summarize, tenant_fairness
from rota.sim.orderings import POLICIES
from rota.sim.workload import Job

# G = 4, shares 1:1 -> Q = 2 each. a1 runs at once; b1 waits 10 s for it.
RECORDS = [
    JobRecord("a1", "a", 2, 0.0, 10.0, [[0.0, 10.0]]),
    JobRecord("b1", "b", 2, 0.0, 20.0, [[10.0, 20.0]]),
]
SHARES = {"a": 1.0, "b": 1.0}


def test_tenant_fairness_is_used_over_deserved_gpu_time() -> None:
    # a: U = 2*10, D = min(2, 2)*10 -> 1.  b: U = 2*10, D = 2*20 -> 0.5
    assert tenant_fairness(RECORDS, SHARES, 4) == {"a": 1.0, "b": 0.5}


def test_job_fairness_caps_the_deserved_share_at_the_jobs_gpus() -> None:
    assert job_fairness(RECORDS, SHARES, 4) == {"a1": 1.0, "b1": 0.5}


def test_summary_figures() -> None:
    s = summarize(RECORDS, SHARES, 4)
    assert s["avg_jct_s"] == 15.0
    assert s["utilization"] == pytest.approx(40 / 80)
    assert s["tenant_f_max_min"] == 2.0
    assert s["tenant_jain"] == pytest.approx(2.25 / 2.5)
    assert s["job_f_in_band"] == 0.5
    assert s["preemptions"] == 0


def test_busy_gpu_time_equals_work_plus_overheads_and_is_conserved_across_views() -> None:
    # Σ per tenant = Σ per job = duration + preemption overheads, read from intervals.
    jobs = [Job("a1", "a", 0, 10000, 1), Job("a2", "a", 0, 10000, 1), Job("b1", "b", 100, 1000, 1)]
    runs = Simulator(jobs, SHARES, SimConfig(2, 2), POLICIES["fair"]()).run()
    recs = [JobRecord(r.job.id, r.tenant, r.gpus, r.job.submit_s, r.end_s, r.intervals) for r in runs]
    per_job = sum(r.gpus * r.held_s for r in recs)
    per_tenant = sum(sum(r.gpus * r.held_s for r in recs if r.tenant == t) for t in SHARES)
    assert per_job == per_tenant == pytest.approx(21000 + 5 + 20)
