"""`rota bench shares`: both arms see the same jobs, and the standings move every tenant's F
towards 1 (the figures themselves are bench/README.md's)."""

from __future__ import annotations

import pytest

from rota.bench import shares


def test_the_standing_arm_brings_each_tenants_f_nearer_1_on_the_same_jobs() -> None:
    tenants = {"a": 1.0, "b": 1.0, "c": 3.0}
    jobs = shares.workload(seed=4, steps=60, tenants=list(tenants))
    queue = shares.simulate(jobs, 60, tenants, standings=False)
    standing = shares.simulate(jobs, 60, tenants, standings=True)
    assert standing["max_dev"] < queue["max_dev"] and standing["jain"] > queue["jain"], (queue, standing)
    assert standing["gpu_fraction"]["c"] > queue["gpu_fraction"]["c"]
    assert abs(sum(standing["gpu_fraction"].values()) - 1) < 1e-9


def test_main_prints_both_arms(capsys: pytest.CaptureFixture[str]) -> None:
    assert shares.main(["--steps", "20", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "F queue" in out and "standing/queue" in out
