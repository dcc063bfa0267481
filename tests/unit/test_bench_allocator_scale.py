"""`rota bench allocator --scale`: its scenarios and its JSON (rota.bench.allocator_scale)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rota.bench import allocator as bench
from rota.bench import allocator_scale
from rota.core.planning.scenario import from_dict, to_dict


def test_the_scale_sizes_reach_8192_gpus_and_20000_jobs() -> None:
    assert {(4096, 5000), (8192, 20000), (1024, 500), (64, 30)} <= set(allocator_scale.SIZES)


def test_a_scale_scenario_is_philly_like_with_gangs_types_and_switches() -> None:
    s = allocator_scale.synthetic(1024, 2000)
    sizes = Counter(j.gpus for j in s.batch)
    assert sum(n for g, n in sizes.items() if g <= 8) > 0.8 * len(s.batch)
    assert {16, 32, 64} <= set(sizes) and max(sizes) == 64
    assert set(s.node_types) == {"a100", "h100"} and len(set(s.node_switches)) > 1
    assert any(j.gpu_types for j in s.batch) and any(j.same_switch for j in s.batch)
    assert from_dict(to_dict(s)).batch == s.batch  # it passes the scenario validator


def test_scale_json_prints_one_row_per_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(allocator_scale, "SIZES", ((8, 10), (64, 30)))
    monkeypatch.setattr(allocator_scale, "FAST_RUNS", 2)
    assert bench.main(["--scale", "--json", "--time-limit", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["scale"]
    assert [(r["gpus"], r["jobs"]) for r in out["scale"]] == [(8, 10), (64, 30)]
    for r in out["scale"]:
        assert {"gpus", "jobs", "fast_ms", "full_s", "full_gain"} <= set(r)
        assert r["full_s"] == 0.5 and r["full_gain"] >= 0 and r["fast_legal"] and r["full_legal"]
        assert r["full_gain"] == pytest.approx(r["full_objective"] / r["fast_objective"] - 1, abs=1e-4)


def test_scale_table_names_each_size(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(allocator_scale, "SIZES", ((8, 10),))
    monkeypatch.setattr(allocator_scale, "FAST_RUNS", 1)
    assert bench.main(["--scale", "--time-limit", "0.3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "full gain" in lines[0] and lines[1].split()[:2] == ["8", "10"]
