"""The semi-real Philly trace: real arrivals and GPU counts, drawn durations."""

from __future__ import annotations

import csv
import math
import random
import re
from pathlib import Path

import pytest

from rota.sim.traces import OneGpuModel, build, make_trace, traces_dir
from rota.sim.workload import Job, TraceError, read_jobs, read_tenants, write_jobs

HAVE_TRACES = (traces_dir() / "philly_vc_arrivals_gavel.csv").exists()
needs_traces = pytest.mark.skipif(
    not HAVE_TRACES, reason="shared traces folder not found (set ROTA_TRACES_DIR)"
)


def test_one_gpu_model_has_the_given_median_and_mean() -> None:
    m = OneGpuModel(median_s=874.0, mean_s=18006.0, max_s=1e12, min_s=0.0)
    assert m.sigma == pytest.approx(math.sqrt(2 * math.log(18006 / 874)))
    rng = random.Random(0)
    xs = sorted(m.draw(rng) for _ in range(20001))
    assert xs[10000] == pytest.approx(874.0, rel=0.08)


@needs_traces
def test_semi_real_trace_keeps_real_arrivals_and_power_of_two_gpus() -> None:
    jobs, shares = build(seed=1, max_jobs=500)
    assert len(jobs) == 500
    assert shares["6214e9"] == 64.0 and len(shares) == 11
    assert all(j.gpus & (j.gpus - 1) == 0 for j in jobs)
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    real = {}
    with open(traces_dir() / "philly_vc_arrivals_gavel.csv", newline="") as f:
        for r in csv.DictReader(f):
            real[f"{r['vc']}-{r['seq']}"] = (float(r["arrival_s"]), int(float(r["num_gpus"])))
    for j in jobs:
        arrival, gpus = real[j.id]
        assert j.submit_s == arrival and gpus <= j.gpus < 2 * gpus


@needs_traces
def test_multi_gpu_durations_are_drawn_from_real_run_times(tmp_path: Path) -> None:
    with open(traces_dir() / "philly_multigpu_pass.csv", newline="") as f:
        real = {float(r["run_s"]) for r in csv.DictReader(f)}
    jobs, _ = build(seed=2, max_jobs=2000)
    multi = [j for j in jobs if j.gpus > 1]
    assert multi and all(j.duration_s in real for j in multi)
    assert build(seed=2, max_jobs=50) == build(seed=2, max_jobs=50)
    jobs_csv, tenants_csv = make_trace(tmp_path, seed=2, max_jobs=50)
    assert read_jobs(jobs_csv) == build(seed=2, max_jobs=50)[0]
    assert sum(read_tenants(tenants_csv).values()) == 352


def test_job_rows_round_trip_and_bad_rows_name_the_line(tmp_path: Path) -> None:
    jobs = [Job("x", "a", 12345678.125, 0.5, 4, 3)]
    write_jobs(tmp_path / "j.csv", jobs)
    assert read_jobs(tmp_path / "j.csv") == jobs
    (tmp_path / "bad.csv").write_text("job_id,tenant,submit_s,duration_s,gpus\nx,a,0,10,3\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: gpus: must be a power of two, got 3"):
        read_jobs(tmp_path / "bad.csv")


HEADER = "job_id,tenant,submit_s,duration_s,gpus,priority,gpu_types,same_switch"


@pytest.mark.parametrize(("row", "field"), [
    (",a,0,10,4,1,,0", "job_id"),
    ("x,,0,10,4,1,,0", "tenant"),
    ("x,a,soon,10,4,1,,0", "submit_s"),
    ("x,a,-1,10,4,1,,0", "submit_s"),
    ("x,a,0,0,4,1,,0", "duration_s"),
    ("x,a,0,nan,4,1,,0", "duration_s"),
    ("x,a,0,10,3,1,,0", "gpus"),
    ("x,a,0,10,two,1,,0", "gpus"),
    ("x,a,0,10,4,high,,0", "priority"),
    ("x,a,0,10,4,1,,yes", "same_switch"),
    ("x,a,0,10,4,1,,0,surplus", "(extra cells)"),
])
def test_a_bad_row_names_the_line_and_the_field(tmp_path: Path, row: str, field: str) -> None:
    (tmp_path / "bad.csv").write_text(f"{HEADER}\n{row}\n")
    with pytest.raises(TraceError, match=rf"bad.csv:2: {re.escape(field)}: "):
        read_jobs(tmp_path / "bad.csv")


def test_an_unknown_column_and_a_bad_share_are_named(tmp_path: Path) -> None:
    (tmp_path / "j.csv").write_text("job_id,tenant,submit_s,duration_s,gpus,colour\nx,a,0,10,4,red\n")
    with pytest.raises(TraceError, match=r"j.csv:2: colour: unknown field"):
        read_jobs(tmp_path / "j.csv")
    (tmp_path / "t.csv").write_text("tenant,share\na,lots\n")
    with pytest.raises(TraceError, match=r"t.csv:2: share: must be a number \(got 'lots'\)"):
        read_tenants(tmp_path / "t.csv")
