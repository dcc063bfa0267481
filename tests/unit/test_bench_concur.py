"""`rota bench concur`: impossible settings are refused naming the field (exit 2), and a
tiny workload gives the JSON shape the issue pins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rota.bench import concur

TINY = {"name": "tiny", "agents": 3, "turns": [1, 2], "gen_tokens": 3, "obs_tokens": 8,
        "tool_latency_s": [0.0, 0.01], "cache_blocks": 16, "seed": 1, "prompt_tokens": 16, "shared_prefix_tokens": 0}


def write(tmp_path: Path, raw: Any) -> str:
    path = tmp_path / "concur.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize(("change", "field"), [
    ({"agents": 0}, "agents"), ({"cache_blocks": 1}, "cache_blocks"), ({"turns": [3, 1]}, "turns"),
    ({"tool_latency_s": [0.5, 0.1]}, "tool_latency_s"), ({"gen_tokens": 0}, "gen_tokens"),
    ({"colour": "red"}, "colour"), ({"caps": [0]}, "caps"), ({"turns": "many"}, "turns"),
])
def test_impossible_workloads_are_refused_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], field: str) -> None:
    code = concur.main(["--config", write(tmp_path, {"workloads": [TINY | change]}), "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"rota: {field}: "), err


def test_bad_config_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert concur.main(["--config", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("rota: --config: ")
    assert concur.main(["--config", write(tmp_path, {"workloads": []})]) == 2
    assert capsys.readouterr().err.startswith("rota: workloads: ")
    assert concur.main(["--config", write(tmp_path, {"workloads": [TINY], "controller": {"w_min": 0}})]) == 2
    assert capsys.readouterr().err.startswith("rota: controller.w_min: ")
    assert concur.main(["--config", write(tmp_path, {"workloads": [TINY], "law": "guess"})]) == 2
    assert capsys.readouterr().err.startswith("rota: law: ")
    assert concur.main(["--config", write(tmp_path, {"workloads": [TINY], "climb": {"backoff": 2}})]) == 2
    assert capsys.readouterr().err.startswith("rota: climb.backoff: ")
    assert concur.main(["--config", write(tmp_path, {"workloads": [TINY], "climb": {"pace": 1}})]) == 2
    assert capsys.readouterr().err.startswith("rota: climb.pace: ")


def test_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        code = concur.main(["--config", write(tmp_path, {"workloads": [TINY | {"caps": [1]}]}), "--json",
                            "--clock", "measured"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (wl,) = out["workloads"]
    assert wl["name"] == "tiny" and set(wl["arms"]) == {"admit_all", "static_best", "controller"}
    for arm in wl["arms"].values():
        assert {"tokens_per_s", "makespan_s", "recompute_ratio", "hit_rate", "evictions", "series",
                "mean_cache_usage"} <= set(arm)
        assert arm["tokens_per_s"] > 0 and arm["series"]
        assert {"tokens_per_s", "active_agents", "usage", "hit_rate"} <= set(arm["series"][0])
    assert wl["arms"]["static_best"]["cap"] in (1, 3)
    assert wl["arms"]["admit_all"]["generated_tokens"] == wl["arms"]["controller"]["generated_tokens"]


def test_vllm_runs_in_measured_time_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert concur.main(["--engine", "vllm", "--clock", "fitted", "--config", write(tmp_path, {"workloads": [TINY]})]) == 2
    assert capsys.readouterr().err.startswith("rota: --clock: ")


def test_vllm_without_its_environment_is_skipped_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROTA_VLLM_VENV", str(tmp_path / "none"))
    assert concur.main(["--engine", "vllm", "--json", "--config", write(tmp_path, {"workloads": [TINY]})]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["engine"] == "vllm" and out["clock"] == "measured" and out["workloads"] == []
    assert "no vLLM virtual environment" in out["skipped"] and "skipped: no vLLM" in captured.err


def test_ideal_prefill_leaves_each_turn_only_what_no_cache_could_hold() -> None:
    from rota.bench.concur_live import ideal_prefill
    from rota.jobkit.inference.agents import AgentPlan

    plan = AgentPlan("a", prompt=list(range(40)), observations=[list(range(20)), list(range(20))], latencies=[0, 0])
    # turn 0: 40 tokens; turn 1: 40 + 8 generated + 20 = 68, the previous sequence's 47 computed
    # tokens give two full blocks of 16 (32): 36; turn 2: 96, 75 computed -> 64 cached: 32
    assert ideal_prefill(plan, gen_tokens=8, block=16) == 40 + 36 + 32


@pytest.mark.parametrize(("repeat", "order"), [(0, [16, 4, 3, 0]), (1, [4, 3, 0, 16]), (2, [3, 0, 16, 4]),
                                               (3, [0, 16, 4, 3]), (4, [16, 4, 3, 0])])
def test_vllm_arms_rotate_one_place_per_repeat(repeat: int, order: list[int]) -> None:
    from rota.bench.concur_vllm import arm_order

    assert arm_order([16, 4, 3, 0], repeat) == order


def _run(tps: float) -> Any:
    from rota.jobkit.inference.agents import RunResult

    return RunResult(tokens_per_s=tps, makespan_s=100 / tps, recompute_ratio=0.0, hit_rate=0.5, evictions=0,
                     mean_usage=0.5, preemptions=0, generated=100, recomputed=0)


@pytest.mark.parametrize(("values", "median"), [([3.0], 3.0), ([5.0, 1.0, 3.0], 3.0), ([4.0, 1.0, 3.0, 2.0], 2.0)])
def test_an_arm_reports_its_median_run(values: list[float], median: float) -> None:
    from rota.bench.concur_vllm import median_run

    assert median_run([_run(v) for v in values]).tokens_per_s == median


def test_repeats_give_the_ratios_within_each_repeat() -> None:
    from rota.bench.concur_vllm import repeats_summary

    runs = {16: [_run(20), _run(40), _run(30)], 4: [_run(60), _run(80), _run(90)], 0: [_run(50), _run(90), _run(60)]}
    out = repeats_summary(runs, agents=16)
    assert out["count"] == 3 and out["tokens_per_s"]["cap 4"] == [60, 80, 90]
    assert out["controller_vs_admit_all"] == {"per_repeat": [2.5, 2.25, 2.0], "median": 2.25}
    assert out["controller_vs_static_best"]["cap"] == 4
    assert out["controller_vs_static_best"]["per_repeat"] == [0.833, 1.125, 0.667]


def test_repeats_are_for_the_vllm_engine_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert concur.main(["--repeats", "3", "--json"]) == 2
    assert capsys.readouterr().err.startswith("rota: --repeats: ")
    assert concur.main(["--engine", "vllm", "--repeats", "0", "--json"]) == 2
    assert capsys.readouterr().err.startswith("rota: --repeats: ")


@pytest.mark.parametrize(("argv", "repeats"), [
    (["--engine", "vllm"], concur.VLLM_REPEATS),
    (["--engine", "vllm", "--repeats", "5"], 5),
    ([], 1),
], ids=["vllm-default", "vllm-given", "rota"])
def test_vllm_arms_repeat_by_default(argv: list[str], repeats: int) -> None:
    assert concur._arguments(argv).repeats == repeats
    assert concur.VLLM_REPEATS > 1  # one wall-clock run of an arm is not a measurement
