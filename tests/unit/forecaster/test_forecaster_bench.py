"""The benchmark's figures: ratio statistics by hand, and the JSON shape acceptance checks read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rota.bench import forecaster as bench
from rota.bench.forecast_traces import traces_dir

HAVE_TRACES = (traces_dir() / "helios_earth_vc_demand_1min.csv.gz").exists()
SCENARIO = Path(__file__).resolve().parents[3] / "bench" / "scenarios" / "training-heavy.json"


def test_ratio_figures_worked_by_hand() -> None:
    # ratios 0.5, 1, 1, 2: |r-1| mean = (0.5 + 0 + 0 + 1) / 4; median 1; P90 = 1 + 0.7 x (2 - 1) = 1.7;
    # actuals 100 (outside 40..60), 100, 30 (on the edge) and 20 inside: coverage 3 / 4
    got = bench.ratios([50, 100, 30, 40], [100, 100, 30, 20], lower=[40, 90, 30, 10], upper=[60, 110, 40, 30])
    assert got == {"n": 4, "mape": 0.375, "p50_ratio": 1.0, "p90_ratio": 1.7, "coverage": 0.75}


@pytest.mark.skipif(not HAVE_TRACES, reason="needs ../shared/data/traces")
def test_the_json_has_the_three_parts_of_each_model_and_the_planning_arms(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--json", "--jobs", "300", "--quant-jobs", "200", "--repeats", "1", "--scenario", str(SCENARIO)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"training", "quantization", "realtime", "planning", "traces", "realtime_vs_reactive"}
    assert [t["name"] for t in out["traces"]] == ["philly-sep-oct", "philly-nov-dec"]
    for t in out["traces"]:
        assert set(t) == {"name", "mape", "p90_coverage", "planning"}
        assert set(t["mape"]) == {"model", "median", "median_by_gpus", "declared"}
        assert set(t["planning"]) == {"oracle", "forecast", "declared", "none"}
        assert all(set(arm) == {"avg_jct_s"} and arm["avg_jct_s"] > 0 for arm in t["planning"].values())
        assert 0 < t["p90_coverage"] < 1
    assert set(out["realtime_vs_reactive"]) == {"forecast", "reactive"}
    for arm in out["realtime_vs_reactive"].values():
        assert set(arm) == {"unmet_gpu_steps", "gpu_hours"} and arm["gpu_hours"] > 0
    assert set(out["training"]) == set(out["quantization"]) == {"model", "prior", "declared"}
    assert set(out["realtime"]) == {"profile", "last_day", "last_week"}
    for part in ("training", "quantization", "realtime", "planning"):
        for inner in out[part].values():
            assert {"mape", "p50_ratio", "p90_ratio"} <= set(inner)
    assert "coverage" in out["training"]["model"] and "coverage" in out["quantization"]["model"]
    assert out["training"]["model"]["n"] == 75  # a quarter of 300 held out
    assert out["planning"]["true"]["mape"] == 0.0 and out["planning"]["true"]["value_vs_true"] == 1.0
    assert set(out["planning"]["forecast"]["scenarios"]) == {"training-heavy"}


def test_bad_flags_exit_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quantile", "1.5"]) == 2
    assert "--quantile" in capsys.readouterr().err
