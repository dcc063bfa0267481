"""Every overlap pass keeps every example block's outputs, on real gloo process groups.

Ranks are real processes (torch.multiprocessing) joined by gloo on loopback; each runs the
blocks, the passes and the planner and writes what it found; the tests read those reports.
Tolerance: torch.allclose(rtol=1e-5, atol=1e-6) against the captured graph's outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from rota.jobkit.overlap.blocks import BLOCK_NAMES, BlockSize
from rota.jobkit.overlap.check import check_rank, free_port
from rota.jobkit.overlap.runtime import ENV_OVERLAP, overlap_enabled

REPO = Path(__file__).resolve().parents[2]
SMALL = BlockSize(batch=4, seq=8, model=16, hidden=32, heads=4)
PASSES = ("capture", "tile2", "reorder2", "bucket2", "tile3", "reorder3", "bucket3")


def _run(tmp: Path, world: int, blocks: tuple[str, ...], ks: tuple[int, ...], plan: bool) -> list[dict]:
    mp.spawn(check_rank, args=(world, free_port(), str(tmp), blocks, ks, SMALL, plan), nprocs=world)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _run(tmp_path_factory.mktemp("overlap2"), 2, BLOCK_NAMES, (2, 3), True)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _run(tmp_path_factory.mktemp("overlap4"), 4, ("tp_mlp", "ep_moe"), (2,), False)


@pytest.mark.parametrize("block", BLOCK_NAMES)
@pytest.mark.parametrize("name", PASSES)
def test_pass_keeps_outputs_on_two_ranks(two_ranks: list[dict], block: str, name: str) -> None:
    for rank, report in enumerate(two_ranks):
        assert report[block][name]["close"], f"rank {rank}: {name} on {block} deviates by {report[block][name]}"


@pytest.mark.parametrize("block", BLOCK_NAMES)
def test_bucketing_merged_something(two_ranks: list[dict], block: str) -> None:
    expected = 2 if block in ("sp_mlp", "ep_moe") else 1  # two collectives per tile, else one
    assert two_ranks[0][block]["bucket2_slots"] == expected
    assert two_ranks[0][block]["bucket3_slots"] == expected


@pytest.mark.parametrize("block", BLOCK_NAMES)
def test_planner_choice_keeps_outputs_and_ranks_agree(two_ranks: list[dict], block: str) -> None:
    summaries = [r[block]["plan_summary"] for r in two_ranks]
    assert all(r[block]["plan"]["close"] for r in two_ranks)
    assert summaries[0] == summaries[1]  # same measurements (max over ranks), same plan
    assert summaries[0]["overlap_plan"] in ("untransformed", "tile2", "tile2+buckets", "tile3", "tile3+buckets")
    assert summaries[0]["predicted_step_s"] > 0 and summaries[0]["predicted_peak_mb"] > 0


@pytest.mark.parametrize("block", ("tp_mlp", "ep_moe"))
@pytest.mark.parametrize("name", ("capture", "tile2", "reorder2", "bucket2"))
def test_pass_keeps_outputs_on_four_ranks(four_ranks: list[dict], block: str, name: str) -> None:
    for rank, report in enumerate(four_ranks):
        assert report[block][name]["close"], f"rank {rank}: {name} on {block} deviates by {report[block][name]}"


def test_example_job_reports_its_plan_with_every_progress_line(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    env = {**os.environ, "ROTA_PROGRESS_FILE": str(progress)}
    env.pop("RANK", None)
    done = subprocess.run([sys.executable, str(REPO / "examples" / "overlap_tp_mlp.py"), "--steps", "3", "--ranks",
                           "2", "--batch", "4", "--seq", "8", "--model", "16", "--hidden", "32"],
                          env=env, capture_output=True, text=True, timeout=300)  # generous: a loaded CI machine
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert len(lines) == 4  # the plan once, then one line per step, from rank 0 only
    for line in lines:
        assert {"overlap_plan", "overlap_k", "overlap_buckets", "predicted_step_s", "predicted_peak_mb"} <= set(line)
        assert line["predicted_step_s"] > 0 and line["overlap_k"] in (1, 2)
    assert lines[-1]["step"] == 3 and lines[-1]["step_s"] > 0


def test_overlap_can_be_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, enabled in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv(ENV_OVERLAP, raw)
        assert overlap_enabled() is enabled
    monkeypatch.setenv(ENV_OVERLAP, "maybe")
    with pytest.raises(ValueError, match=ENV_OVERLAP):
        overlap_enabled()
