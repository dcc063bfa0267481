"""`python -m rota.bench.vllm_server`: bad arguments are refused naming the flag, before any
virtual environment is probed or server started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rota.bench.vllm_server import VllmServer, main


@pytest.mark.parametrize(("content", "flag"), [
    ("[1, 2]", "--model-config: must hold a JSON object"),
    ("{not json", "--model-config:"),
    (None, "--model-config:"),  # no such file
], ids=["not-an-object", "not-json", "missing"])
def test_a_bad_model_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       content: str | None, flag: str) -> None:
    path = tmp_path / "model.json"
    if content is not None:
        path.write_text(content)
    assert main(["--cache-blocks", "256", "--model-config", str(path)]) == 2
    assert flag in capsys.readouterr().err


def test_a_cache_too_small_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cache-blocks", "1"]) == 2
    assert "--cache-blocks: must be at least 2, got 1" in capsys.readouterr().err


def test_negative_threads_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cache-blocks", "256", "--threads", "-1"]) == 2
    assert "--threads: must be at least 1, or 0 for one fewer than the cores; got -1" in capsys.readouterr().err


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (16, 15), (None, 1)])
def test_the_engine_leaves_a_core_to_the_api_server_and_the_agents(monkeypatch: pytest.MonkeyPatch,
                                                                    cores: int | None, threads: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    server = VllmServer(Path("python"), Path("model"), cache_blocks=64)
    assert server.environment()["OMP_NUM_THREADS"] == str(threads)


def test_threads_given_are_the_engines() -> None:
    server = VllmServer(Path("python"), Path("model"), cache_blocks=64, threads=3)
    env = server.environment()
    assert env["OMP_NUM_THREADS"] == "3"
    assert "PYTHONPATH" not in env
