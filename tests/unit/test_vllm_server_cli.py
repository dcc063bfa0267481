"""`python -m rota.bench.vllm_server`: bad arguments are refused naming the flag, before any
virtual environment is probed or server started."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.bench.vllm_server import main


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
