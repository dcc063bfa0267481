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


def _without(key: str) -> dict[str, Any]:
    doc = _doc()
    del doc[key]
    return doc


def _lr(**fields: Any) -> dict[str, Any]:
    return {"space": {"lr": {"distribution": "float", "low": 0.001, "high": 0.1, **fields}}}


# One bad input per field, each named by its dotted path.
PER_FIELD = [
    (_without("name"), "name"),
    (_doc(kind="train"), "kind"),
    (_without("data"), "data"),
    (_doc(factory_args=[1]), "factory_args"),
    (_doc(data_args="batch=8"), "data_args"),
    (_doc(train="rota.tuning.no_such_module:train"), "train"),
    (_doc(objective={"metric": "accuracy"}), "objective.metric"),
    (_doc(objective={"goal": "min"}), "objective.goal"),
    (_doc(objective="minimize"), "objective"),
    (_without("space"), "space"),
    (_doc(space={"lr": 0.1}), "space.lr"),
    (_doc(**_lr(log="yes")), "space.lr.log"),
    (_doc(**_lr(step=0)), "space.lr.step"),
    (_doc(**_lr(step=0.01, log=True)), "space.lr.step"),
    (_doc(**_lr(low="small")), "space.lr.low"),
    (_doc(**_lr(high=float("inf"))), "space.lr.high"),
    (_doc(space={"n": {"distribution": "int", "low": 1, "high": 2.5}}), "space.n"),
    (_doc(space={"h": {"distribution": "categorical"}}), "space.h.choices"),
    (_doc(space={"h": {"distribution": "categorical", "choices": [1], "low": 0}}), "space.h.low"),
    (_doc(space={"h": {"type": "normal"}}), "space.h.distribution"),
    (_without("budget"), "budget"),
    (_doc(budget={"trials": 4}), "budget.steps"),
    (_doc(budget={"trials": 4, "steps": 10, "report_every": 0}), "budget.report_every"),
    (_doc(budget={"trials": True, "steps": 10}), "budget.trials"),
    (_doc(scale=0), "scale"),
    (_doc(fusion="max"), "fusion"),
    (_doc(sampler={"type": "random"}), "sampler.type"),
    (_doc(sampler={"seed": "0"}), "sampler.seed"),
    (_doc(pruner={"min_resource": 0}), "pruner.min_resource"),
    (_doc(pruner={"reduction_factor": 1}), "pruner.reduction_factor"),
    (_doc(transfer={"steps": -1}), "transfer.steps"),
    (_doc(transfer={"at": float("nan")}), "transfer.at"),
    (_doc(transfer={"at": 0.5, "when": 1}), "transfer.when"),
]


@pytest.mark.parametrize(("doc", "field"), PER_FIELD, ids=[f for _, f in PER_FIELD])
def test_each_field_is_named_when_bad(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_spec(doc)
    assert str(err.value).startswith(f"{field}: "), str(err.value)


def test_a_file_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^job file: must be a mapping, got list"):
        parse_spec([1, 2])


def test_a_null_seed_and_step_are_as_if_absent() -> None:
    spec = parse_spec(_doc(sampler={"seed": None}, **_lr(step=None)))
    assert spec.sampler_seed is None and spec.space["lr"].step is None
