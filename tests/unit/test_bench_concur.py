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
