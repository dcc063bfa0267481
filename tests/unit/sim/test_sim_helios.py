"""The semi-real Helios Earth trace: net arrivals and sizes from the per-minute VC counts,
shares from the daily quotas, durations scaled to each VC's real mean demand."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rota.sim.helios import build_helios

HEAD = "time,vc,running_gpujob_num,pending_gpujob_num,total_gpu_num,running_gpu_num,pending_gpu_num\n"


def _src(tmp_path: Path) -> Path:
    rows = [  # vcA: +2 jobs (+8 GPUs) at minute 1, then +1 job with no new GPUs; vcB: none
        "2020-05-01 00:00:00,vcA,1,0,64,4,0", "2020-05-01 00:00:00,vcB,0,0,16,0,0",
        "2020-05-01 00:01:00,vcA,2,1,64,8,4", "2020-05-01 00:01:00,vcB,0,0,16,0,0",
        "2020-05-01 00:02:00,vcA,4,0,64,12,0", "2020-05-01 00:02:00,vcB,0,0,16,0,0",
        "2020-05-02 00:00:00,vcA,0,0,64,0,0", "2020-05-02 00:00:00,vcB,9,0,16,9,0",
    ]
    with gzip.open(tmp_path / "helios_earth_vc_demand_1min.csv.gz", "wt") as f:
        f.write(HEAD + "\n".join(rows) + "\n")
    (tmp_path / "helios_earth_vc_gpus_daily.csv").write_text("date,vcA,vcB,vcC,total\n2020-05-01,64,0,8,72\n")
    (tmp_path / "helios_cluster_summary.csv").write_text(
        "id,avg_run_time_gpu,med_run_time_gpu\nEarth,5130.609,234.0\n")
    return tmp_path


def test_net_arrivals_and_sizes_come_from_the_minute_counts(tmp_path: Path) -> None:
    jobs, shares = build_helios(_src(tmp_path), seed=3, days=1.0)
    assert shares == {"vcA": 64.0, "vcB": 64.0}  # vcB had no quota that day: the smallest of the others
    assert [(j.tenant, j.submit_s, j.gpus) for j in jobs] == [
        ("vcA", 15.0, 4), ("vcA", 45.0, 4), ("vcA", 90.0, 1),  # 8 new GPUs over 2 jobs; then none
    ]
    assert all(60 <= j.duration_s <= 14 * 86400 for j in jobs)
    assert build_helios(tmp_path, seed=3, days=1.0) == (jobs, shares)


def test_durations_match_the_vcs_mean_demand_on_average(tmp_path: Path) -> None:
    src = _src(tmp_path)
    rows = [f"2020-05-01 {m // 60:02d}:{m % 60:02d}:00,vcA,{m},0,64,{m},0" for m in range(600)]
    with gzip.open(src / "helios_earth_vc_demand_1min.csv.gz", "wt") as f:
        f.write(HEAD + "\n".join(rows) + "\n")
    jobs, _ = build_helios(src, seed=0, days=1.0)
    assert len(jobs) == 599 and all(j.gpus == 1 for j in jobs)
    assert build_helios(src, seed=1, days=1.0)[0] != jobs  # the seed draws the durations
    # Little's law: Σ gpus · duration ≈ mean GPUs · window (600 minutes, mean 299.5 GPUs), up to
    # the log-normal's sampling noise and the [60 s, 14 d] cut.
    assert sum(j.duration_s for j in jobs) == pytest.approx(299.5 * 600 * 60, rel=0.6)
