"""examples/agentic_batch.py runs as the agent runs it: progress carries the controller's
window, usage, hit rate, recompute ratio and agents done; a restart skips finished agents;
impossible settings are refused naming the field."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["examples/agentic_batch.py", "--agents", "4", "--turns", "2", "3", "--gen-tokens", "4", "--obs-tokens", "16",
        "--cache-blocks", "32", "--control-interval", "0.01"]


def run(extra: list[str], progress: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env["ROTA_PROGRESS_FILE"] = str(progress)
    return subprocess.run([sys.executable, *ARGS, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def in_process() -> Callable[[list[str]], int]:
    """The example's main, loaded from its file (no second interpreter to start)."""
    spec = importlib.util.spec_from_file_location("agentic_batch_example", ROOT / "examples" / "agentic_batch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main: Callable[[list[str]], int] = module.main
    return main


def test_reports_the_controller_and_resumes_without_redoing_finished_agents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    progress = tmp_path / "progress.jsonl"
    first = run(["--state-dir", str(state)], progress)
    assert first.returncode == 0, first.stderr
    reports = [json.loads(line) for line in progress.read_text().splitlines()]
    last = reports[-1]
    assert {"window", "usage", "hit_rate", "recompute_ratio", "agents_done", "active", "held", "admission_url"} <= set(last)
    assert last["agents_done"] == last["agents"] == 4 and last["generated"] > 0
    done = [json.loads(line)["agent"] for line in (state / "agents_done.jsonl").read_text().splitlines()]
    assert sorted(done) == ["a000", "a001", "a002", "a003"]
    saved = json.loads((state / "controller.json").read_text())
    monkeypatch.setenv("ROTA_PROGRESS_FILE", str(progress))
    threads = torch.get_num_threads()
    try:
        assert in_process()([*ARGS[1:], "--state-dir", str(state)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "(4 already done)" in capsys.readouterr().out
    final = json.loads(progress.read_text().splitlines()[-1])
    assert final["agents_done"] == 4 and final["generated"] == 0 and final["window"] == saved["window"]


def test_impossible_settings_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    main = in_process()
    assert main([*ARGS[1:], "--agents", "0"]) == 2
    assert capsys.readouterr().err.strip() == "agentic_batch: agents: must be at least 1, got 0"
    assert main([*ARGS[1:], "--cache-blocks", "2"]) == 2
    assert capsys.readouterr().err.startswith("agentic_batch: cache_blocks: ")
