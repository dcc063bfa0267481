"""`rota sim --render`: fairness over time and JCT CDFs from a schedule, worked out by hand,
and the PNGs written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rota.sim.cli import main
from rota.sim.engine import SimConfig, Simulator
from rota.sim.metrics import JobRecord, summarize, tenant_fairness
from rota.sim.orderings import POLICIES
from rota.sim.render import (
    fairness_over_time,
    jct_cdf,
    max_over_min,
    render,
    sample_times,
    step_integral,
    used_and_deserved,
)
from rota.sim.workload import Job

# G = 4, shares 1:1 -> Q = 2 each. a1 runs at once for 10 s; b1 waits 10 s for it.
RECORDS = [
    JobRecord("a1", "a", 2, 0.0, 10.0, [[0.0, 10.0]]),
    JobRecord("b1", "b", 2, 0.0, 20.0, [[10.0, 20.0]]),
]
SHARES = {"a": 1.0, "b": 1.0}
PNG = b"\x89PNG\r\n\x1a\n"


def test_step_integral_of_a_step_function_with_shared_event_times() -> None:
    # level: 0 before 1; 3 on [1, 4); 1 on [4, 6) (two events at 4); 0 after.
    times = np.array([1.0, 4.0, 4.0, 6.0])
    deltas = np.array([3.0, -3.0, 1.0, -1.0])
    at = np.array([0.0, 1.0, 2.5, 4.0, 5.0, 6.0, 100.0])
    assert step_integral(times, deltas, at) == pytest.approx([0, 0, 4.5, 9, 10, 11, 11])
    # Capped at 2: 2 on [1, 4), 1 on [4, 6).
    assert step_integral(times, deltas, at, cap=2.0) == pytest.approx([0, 0, 3, 6, 7, 8, 8])
    assert step_integral(np.zeros(0), np.zeros(0), at) == pytest.approx(np.zeros(len(at)))


def test_used_and_deserved_by_hand() -> None:
    ud = used_and_deserved(RECORDS, SHARES, 4, np.array([5.0, 15.0, 20.0]))
    # a: runs 2 GPUs over [0, 10], demand 2 = Q over [0, 10].
    assert ud["a"][0] == pytest.approx([10, 20, 20]) and ud["a"][1] == pytest.approx([10, 20, 20])
    # b: runs over [10, 20], demand 2 = Q over [0, 20].
    assert ud["b"][0] == pytest.approx([0, 10, 20]) and ud["b"][1] == pytest.approx([10, 30, 40])


def test_cumulative_fairness_over_time_by_hand_ends_at_the_summary() -> None:
    f = fairness_over_time(RECORDS, SHARES, 4, np.array([5.0, 15.0, 20.0]))
    assert f["a"] == pytest.approx([1.0, 1.0, 1.0])
    assert f["b"] == pytest.approx([0.0, 1 / 3, 0.5])  # 0/10, 10/30, 20/40
    assert {t: v[-1] for t, v in f.items()} == pytest.approx(tenant_fairness(RECORDS, SHARES, 4))
    # max F / min F: infinite while b, owed GPU-time, has had none; then 3; then the summary's 2.
    r = max_over_min(f)
    assert math.isinf(r[0]) and r[1:] == pytest.approx(
        [3.0, summarize(RECORDS, SHARES, 4)["tenant_f_max_min"]]
    )


def test_max_over_min_is_undefined_where_no_tenant_is_or_all_have_had_nothing() -> None:
    nan = float("nan")
    r = max_over_min({"a": np.array([nan, 0.0, 2.0]), "b": np.array([nan, 0.0, nan])})
    assert math.isnan(r[0]) and math.isnan(r[1]) and r[2] == 1.0


def test_borrowing_above_quota_shows_as_f_above_one() -> None:
    # a runs two 2-GPU jobs at once (demand 4 > Q = 2): U grows at 4, D at 2.
    recs = [
        JobRecord("a1", "a", 2, 0.0, 10.0, [[0.0, 10.0]]),
        JobRecord("a2", "a", 2, 0.0, 10.0, [[0.0, 10.0]]),
    ]
    assert fairness_over_time(recs, SHARES, 4, np.array([5.0, 10.0]))["a"] == pytest.approx([2.0, 2.0])


def test_sliding_window_fairness_by_hand() -> None:
    at = np.array([5.0, 15.0, 20.0])
    f = fairness_over_time(RECORDS, SHARES, 4, at, window_s=5.0)
    # a over (0,5]: 10/10; over (10,15] and (15,20] it has no demand -> undefined.
    assert f["a"][0] == pytest.approx(1.0) and np.isnan(f["a"][1:]).all()
    # b over (0,5]: 0/10; over (10,15]: 10/10; over (15,20]: 10/10.
    assert f["b"] == pytest.approx([0.0, 1.0, 1.0])
    # A window wider than the run is the cumulative figure.
    assert fairness_over_time(RECORDS, SHARES, 4, at, window_s=1e9)["b"] == pytest.approx([0, 1 / 3, 0.5])


def test_tenants_that_never_deserve_anything_are_left_out() -> None:
    f = fairness_over_time(RECORDS, {**SHARES, "c": 1.0}, 6, np.array([5.0, 20.0]))
    assert set(f) == {"a", "b"}


def test_final_point_matches_metrics_on_a_simulated_schedule_with_preemptions() -> None:
    jobs = [
        Job("a1", "a", 0, 10000, 1),
        Job("a2", "a", 0, 10000, 1),
        Job("b1", "b", 100, 1000, 1),
        Job("b2", "b", 3000, 4000, 2),
    ]
    runs = Simulator(jobs, SHARES, SimConfig(2, 2), POLICIES["fair"]()).run()
    recs = [JobRecord(r.job.id, r.tenant, r.gpus, r.job.submit_s, r.end_s, r.intervals) for r in runs]
    assert sum(len(r.intervals) - 1 for r in recs) > 0  # the case exercises preemption
    at = sample_times(recs, 50)
    assert at[0] == 0.0 and at[-1] == max(r.end_s for r in recs)
    f = fairness_over_time(recs, SHARES, 2, at)
    assert {t: v[-1] for t, v in f.items()} == pytest.approx(tenant_fairness(recs, SHARES, 2))


def test_jct_cdf_is_sorted_monotone_and_ends_at_one() -> None:
    recs = [*RECORDS, JobRecord("c1", "a", 1, 5.0, 8.0, [[5.0, 8.0]])]
    x, y = jct_cdf(recs)
    assert list(x) == [3.0, 10.0, 20.0]
    assert list(y) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert np.all(np.diff(y) > 0) and y[-1] == 1.0


def test_render_writes_one_png_per_policy_plus_max_min_and_cdf(tmp_path: Path) -> None:
    paths = render(tmp_path / "out", {"fifo": RECORDS, "fair": RECORDS}, SHARES, 4, points=20)
    names = sorted(p.name for p in paths)
    assert names == ["fairness_fair.png", "fairness_fifo.png", "fairness_max_min.png", "jct_cdf.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG


def test_cli_render_keeps_json_on_stdout_and_names_files_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "JOBS.csv").write_text(
        "job_id,tenant,submit_s,duration_s,gpus\na1,a,0,10000,1\na2,a,0,10000,1\nb1,b,100,1000,1\n"
    )
    (tmp_path / "TENANTS.csv").write_text("tenant,share\na,1\nb,1\n")
    out = tmp_path / "pics"
    argv = [
        "--trace",
        str(tmp_path / "JOBS.csv"),
        "--tenants",
        str(tmp_path / "TENANTS.csv"),
        "--gpus",
        "2",
        "--gpus-per-node",
        "2",
        "--policy",
        "fifo,fair",
        "--json",
        "--render",
        str(out),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert set(json.loads(captured.out)["policies"]) == {"fifo", "fair"}
    assert sorted(p.name for p in out.iterdir()) == [
        "fairness_fair.png",
        "fairness_fifo.png",
        "fairness_max_min.png",
        "jct_cdf.png",
    ]
    assert captured.err.count("wrote ") == 4


def test_simulator_and_metrics_do_not_load_matplotlib() -> None:
    code = (
        "import sys, rota.sim.cli, rota.sim.engine, rota.sim.metrics; "
        "assert 'matplotlib' not in sys.modules and 'rota.sim.render' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
