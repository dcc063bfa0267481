"""`rota sim --quotas`: limits are never exceeded and an owner within its guarantee gets its
GPUs back from borrowers one checkpoint later, under every policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.core.fairness.quotas import Quota
from rota.sim.engine import SimConfig
from rota.sim.metrics import JobRecord
from rota.sim.orderings import POLICIES
from rota.sim.quotas import QuotaSimulator, peak_holding, quota_figures, read_quotas
from rota.sim.workload import Job, TraceError

QUOTAS = {"a": Quota("a", guaranteed=4, limit=6), "b": Quota("b", guaranteed=4, limit=8)}
CFG = SimConfig(8, 8, checkpoint_s=5.0, resume_s=20.0)


def trace() -> list[Job]:
    # a floods the cluster from t=0; b comes back at t=100 with its guarantee's worth.
    hog = [Job(f"a{i}", "a", 0.0, 10_000.0, 1) for i in range(10)]
    return [*hog, *(Job(f"b{i}", "b", 100.0, 50.0, 1) for i in range(4))]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_limits_hold_and_the_owner_is_served_within_one_checkpoint(policy: str) -> None:
    sim = QuotaSimulator(trace(), {"a": 1.0, "b": 1.0}, CFG, POLICIES[policy](), QUOTAS)
    runs = sim.run()
    records = [JobRecord(r.job.id, r.tenant, r.gpus, r.job.submit_s, r.end_s, r.intervals) for r in runs]
    peaks = peak_holding([(r.tenant, r.gpus, r.intervals) for r in records])
    assert peaks["a"] == 6  # borrowed up to its limit, never past it
    first_b = min(r.intervals[0][0] for r in runs if r.tenant == "b")
    assert first_b <= 100.0 + CFG.checkpoint_s  # 2 GPUs idle at once, the other 2 one checkpoint later
    assert max(r.intervals[0][0] for r in runs if r.tenant == "b") == 100.0 + CFG.checkpoint_s
    figures = quota_figures(sim, records)
    assert figures["reclaims"] == 2 and figures["over_limit"] == {}


def test_quotas_file_is_checked_naming_the_field(tmp_path: Path) -> None:
    good = tmp_path / "q.csv"
    good.write_text("tenant,guaranteed,limit,parent\ndept,8,16,\ng1,4,,dept\n")
    assert read_quotas(good)["g1"] == Quota("g1", 4, None, "dept")
    bad = tmp_path / "bad.csv"
    bad.write_text("tenant,guaranteed,limit\na,8,4\n")
    with pytest.raises(TraceError, match="limit: 4 is below the guarantee 8"):
        read_quotas(bad)


def test_rota_sim_quotas_prints_the_reclaims_and_no_tenant_over_its_limit(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from rota.sim.cli import main
    from rota.sim.workload import write_jobs, write_tenants

    write_jobs(tmp_path / "JOBS.csv", trace())
    write_tenants(tmp_path / "TENANTS.csv", {"a": 1.0, "b": 1.0})
    (tmp_path / "QUOTAS.csv").write_text("tenant,guaranteed,limit\na,4,6\nb,4,8\n")
    assert main(["--trace", str(tmp_path / "JOBS.csv"), "--tenants", str(tmp_path / "TENANTS.csv"), "--gpus", "8",
                 "--policy", "fair,drf", "--quotas", str(tmp_path / "QUOTAS.csv")]) == 0
    out = capsys.readouterr().out
    assert "fair: 2 borrowers reclaimed; tenants over their limit: none" in out
    assert "drf: 2 borrowers reclaimed" in out
