"""The tuning job file: good input parses, bad input is refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rota.jobkit.tuning.space import parse_spec


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "lm", "factory": "rota.jobkit.tuning.lm:tiny_lm", "data": "rota.jobkit.tuning.lm:stdlib_batches",
        "space": {"lr": {"distribution": "float", "low": 1e-4, "high": 1e-1, "log": True},
                  "heads": {"distribution": "categorical", "choices": [2, 4]},
                  "layers": {"distribution": "int", "low": 1, "high": 3}},
        "budget": {"trials": 8, "steps": 40},
    }
    doc.update(changes)
    return doc


def test_a_good_file_parses_with_defaults() -> None:
    spec = parse_spec(_doc(fusion=4, transfer={"at": 0.5, "steps": 10}))
    assert spec.trials == 8 and spec.steps == 40 and spec.report_every == 8
    assert spec.space["lr"].log and spec.space["heads"].choices == (2, 4)
    assert spec.fusion == 4 and spec.scale == 1 and spec.pruner == "successive_halving"
    assert spec.transfer_at == 0.5 and spec.transfer_steps == 10
    assert parse_spec(_doc()).fusion is None  # auto: from profiled memory


@pytest.mark.parametrize(("changes", "message"), [
    ({"space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.01}}}, r"^space\.lr: low must be below high"),
    ({"space": {"lr": {"distribution": "gaussian", "low": 0, "high": 1}}}, r"^space\.lr\.distribution: unknown distribution 'gaussian'"),
    ({"space": {"lr": {"distribution": "float", "low": 0, "high": 1, "log": True}}}, r"^space\.lr\.low: a log distribution"),
    ({"space": {"lr": {"distribution": "float", "high": 1}}}, r"^space\.lr\.low: missing"),
    ({"space": {"lr": {"distribution": "float", "low": 0, "high": 1, "mean": 3}}}, r"^space\.lr\.mean: not a field"),
    ({"space": {"h": {"distribution": "categorical", "choices": []}}}, r"^space\.h\.choices"),
    ({"space": {}}, r"^space: needs at least one"),
    ({"budget": {"trials": 0, "steps": 10}}, r"^budget\.trials: must be a positive integer"),
    ({"budget": {"trials": 4, "steps": -1}}, r"^budget\.steps: must be a positive integer"),
    ({"budget": {"trials": 4, "steps": 10, "hours": 2}}, r"^budget\.hours: unknown field"),
    ({"factory": "rota.jobkit.tuning.no_such_module:make"}, r"^factory: cannot import module 'rota\.jobkit\.tuning\.no_such_module'"),
    ({"factory": "rota.jobkit.tuning.lm:no_such_factory"}, r"^factory: module 'rota\.jobkit\.tuning\.lm' has no attribute"),
    ({"factory": "rota.jobkit.tuning.lm:VOCAB"}, r"^factory: 'rota\.jobkit\.tuning\.lm:VOCAB' is not callable"),
    ({"data": 3}, r"^data: must name an importable callable"),
    ({"pruner": {"type": "random"}}, r"^pruner\.type: unknown pruner 'random'"),
    ({"objective": {"direction": "sideways"}}, r"^objective\.direction"),
    ({"transfer": {"at": 1.5}}, r"^transfer\.at"),
    ({"fusion": 0}, r"^fusion: must be a positive integer"),
    ({"scale": "four"}, r"^scale: must be a positive integer"),
    ({"name": "bad name!"}, r"^name: "),
    ({"epochs": 3}, r"^epochs: unknown field"),
])
def test_bad_input_is_refused_naming_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(_doc(**changes))


def test_a_missing_factory_is_named() -> None:
    doc = _doc()
    del doc["factory"]
    with pytest.raises(ValueError, match=r"^factory: missing"):
        parse_spec(doc)


def test_the_example_tuning_file_parses() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "tune" / "stdlib-lm.yaml"
    spec = parse_spec(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert spec.scale == 4 and spec.fusion is None and spec.transfer_at == 0.5
