"""A small study end to end: Optuna asks, fused trials train, a crashing trial is recorded and the study goes on."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from rota.jobkit.tuning.cli import main
from rota.jobkit.tuning.space import parse_spec
from rota.jobkit.tuning.study import run_study, summarise

FACTORY = '''
from rota.jobkit.tuning.lm import TinyLM


def flaky_lm(crash: bool = False, width: int = 32):
    if crash:
        raise RuntimeError("this configuration does not build")
    return TinyLM(width=width, layers=1, heads=2, context=16)
'''


pytestmark = pytest.mark.usefixtures("torch_one_thread")  # tests/conftest.py


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "flaky_factory.py").write_text(FACTORY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("ROTA_TUNE_STORAGE", raising=False)
    doc = {
        "name": "tiny", "kind": "tune", "factory": "flaky_factory:flaky_lm",
        "data": "rota.jobkit.tuning.lm:stdlib_batches", "data_args": {"batch": 4, "context": 16, "max_bytes": 100_000},
        "space": {"lr": {"distribution": "float", "low": 1e-3, "high": 3e-2, "log": True},
                  "crash": {"distribution": "categorical", "choices": [False, True]}},
        "budget": {"trials": 6, "steps": 8, "report_every": 4}, "scale": 2, "fusion": 3,
        "sampler": {"seed": 1}, "pruner": {"type": "successive_halving", "min_resource": 4, "reduction_factor": 2},
        "transfer": {"at": 0.5, "steps": 4},
    }
    path = tmp_path / "tune_tiny.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_a_crashing_trial_is_recorded_failed_and_the_study_goes_on(job_file: Path) -> None:
    spec = parse_spec(yaml.safe_load(job_file.read_text(encoding="utf-8")))
    seen: list[int] = []
    result = run_study(spec, "tiny-1", on_change=lambda study, _: seen.append(len(study.trials)))
    trials = result.study.trials
    assert len(trials) == 6
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and all(t.params["crash"] for t in failed)
    assert all("RuntimeError: this configuration does not build" == t.user_attrs["error"] for t in failed)
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert finished and not any(t.params["crash"] for t in finished)
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.intermediate_values for t in finished)  # each reported at the first rung
    # Eager transfer after half the budget: the best so far trained at full scale.
    assert result.transfer is not None and result.transfer["steps"] == 4 and result.transfer["loss"] is not None
    summary = summarise(result.study)
    assert summary["best"] is not None and summary["counts"]["fail"] == len(failed)
    assert seen  # results were saved as the study went


def test_cli_runs_a_study_and_status_shows_it(job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert main([str(job_file), "--results", str(results), "--id", "s1", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["state"] == "done" and len(ran["trials"]) == 6 and ran["storage"] == "json"
    assert main(["status", "s1", "--results", str(results), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["best"] == ran["best"] and status["counts"] == ran["counts"]
    assert main(["status", "s1", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "best: trial" in table and "error: RuntimeError" in table


def test_cli_refuses_bad_input_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nfactory: rota.jobkit.tuning.lm:tiny_lm\ndata: rota.jobkit.tuning.lm:stdlib_batches\n"
                   "space: {lr: {distribution: float, low: 1, high: 0.1}}\nbudget: {trials: 2, steps: 2}\n", encoding="utf-8")
    assert main([str(bad), "--results", str(tmp_path)]) == 2
    assert "space.lr: low must be below high" in capsys.readouterr().err
    assert main(["status", "nope", "--results", str(tmp_path)]) == 2
    assert "ID: no study 'nope'" in capsys.readouterr().err


def test_a_study_kept_in_postgres_through_optuna_rdb_storage(job_file: Path, tmp_path: Path, empty_database_url: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(job_file), "--results", str(tmp_path), "--id", "pg1", "--storage", empty_database_url, "--json"]) == 0
    capsys.readouterr()
    (tmp_path / "pg1.json").unlink()  # status must come from Postgres, not the file
    assert main(["status", "pg1", "--storage", empty_database_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert len(status["trials"]) == 6 and status["best"] is not None and status["transfer"] is not None
