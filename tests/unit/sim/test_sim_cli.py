"""`rota sim` command line: the docs/design.md §4 JSON contract, the table and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rota.sim.cli import main
from rota.sim.metrics import JobRecord, summarize


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "JOBS.csv").write_text(
        "job_id,tenant,submit_s,duration_s,gpus\n"
        "a1,a,0,10000,1\na2,a,0,10000,1\nb1,b,100,1000,1\nb2,b,200,500,2\n"
    )
    (tmp_path / "TENANTS.csv").write_text("tenant,share\na,1\nb,1\n")
    return tmp_path / "JOBS.csv", tmp_path / "TENANTS.csv"


def test_json_holds_summary_and_schedule_per_policy(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    jobs, tenants = trace
    args = ["--trace", str(jobs), "--tenants", str(tenants), "--gpus", "2", "--gpus-per-node", "2"]
    assert main([*args, "--policy", "fifo,fair", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"fifo", "fair"}
    fair = out["policies"]["fair"]
    assert {"id", "tenant", "gpus", "submit_s", "end_s", "intervals"} <= set(fair["jobs"][0])
    # A reader recomputes the figures from the schedule alone.
    recs = [
        JobRecord(j["id"], j["tenant"], j["gpus"], j["submit_s"], j["end_s"], j["intervals"])
        for j in fair["jobs"]
    ]
    again = summarize(recs, {"a": 1, "b": 1}, 2)
    for key in ("avg_jct_s", "utilization", "tenant_f_max_min", "tenant_jain", "job_f_in_band"):
        assert fair[key] == pytest.approx(again[key])


def test_table_by_default(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    jobs, tenants = trace
    assert main(["--trace", str(jobs), "--tenants", str(tenants), "--gpus", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("policy") and [ln.split()[0] for ln in lines[2:]] == [
        "fifo",
        "sjf",
        "las",
        "drf",
        "ftf",
        "fair",
        "easy",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "6"], "multiple of gpus_per_node"),
        (["--gpus", "8", "--policy", "nope"], "--policy: unknown nope"),
    ],
)
def test_errors_exit_nonzero_with_one_line(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    jobs, tenants = trace
    assert main(["--trace", str(jobs), "--tenants", str(tenants), *extra]) != 0
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["--trace", str(tmp_path / "no.csv"), "--tenants", str(tmp_path / "no.csv"), "--gpus", "8"]) == 1
    )
    assert "no.csv" in capsys.readouterr().err
