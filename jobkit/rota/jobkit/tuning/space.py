"""The tuning job file: its fields, checked, with errors that name the field.

A job file (YAML or JSON)::

    name: stdlib-lm
    factory: rota.jobkit.tuning.lm:tiny_lm         # importable callable -> nn.Module
    factory_args: {width: 64, layers: 2, heads: 2, context: 32}
    data: rota.jobkit.tuning.lm:stdlib_batches      # callable(seed=..., **data_args) -> next()/eval_batch()
    data_args: {batch: 8, context: 32}
    train: fused                             # or module:callable(model, hparams, steps, report) -> loss
    objective: {metric: loss, direction: minimize}
    space:
      lr: {distribution: float, low: 0.0005, high: 0.2, log: true}
      output_mult: {distribution: float, low: 0.25, high: 4, log: true}
    budget: {trials: 12, steps: 100, report_every: 20}
    scale: 4                                 # surrogate width divisor S
    fusion: auto                             # or a positive integer (cap)
    sampler: {type: tpe, seed: 0}
    pruner: {type: successive_halving, min_resource: 20, reduction_factor: 2}   # or hyperband, none
    transfer: {at: 0.5, steps: 100}          # eager transfer: share of trials done, full-scale steps

Space keys that are fused-trial hyperparameters (``lr``, ``beta1``, ``beta2``,
``weight_decay``, ``output_mult``, ``eps``) go to the optimizer; every other key is passed
to the factory as a keyword argument.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

from rota.core.schema import Check, Field, Schema, validate

__all__ = ["Distribution", "TuneSpec", "import_callable", "parse_spec"]

DISTRIBUTIONS = ("float", "int", "categorical")
PRUNERS = ("successive_halving", "hyperband", "median", "none")


@dataclass(frozen=True)
class Distribution:
    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "float":
            assert self.low is not None and self.high is not None
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            assert self.low is not None and self.high is not None
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.name, list(self.choices))


@dataclass(frozen=True)
class TuneSpec:
    name: str
    factory: str
    data: str
    space: dict[str, Distribution]
    trials: int
    steps: int
    report_every: int
    scale: int
    fusion: int | None  # None: from profiled memory
    direction: str = "minimize"
    train: str = "fused"
    factory_args: dict[str, Any] = field(default_factory=dict)
    data_args: dict[str, Any] = field(default_factory=dict)
    sampler_seed: int | None = None
    pruner: str = "successive_halving"
    min_resource: int = 1
    reduction_factor: int = 3
    transfer_at: float = 1.0
    transfer_steps: int = 0


def import_callable(path: Any, field_name: str) -> Callable[..., Any]:
    """The callable named ``module:attr`` (or ``module.attr``), or ValueError naming the field."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{field_name}: must name an importable callable as 'module:attr', got {path!r}")
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{field_name}: {path!r} is not 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error of any kind is the file's fault, reported as such
        raise ValueError(f"{field_name}: cannot import module {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{field_name}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{field_name}: {path!r} is not callable")
    return target  # type: ignore[no-any-return]


def _mapping(value: Any, field_name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{field_name}: must be a mapping, got {type(value).__name__}")
    return value


def _importable(field_name: str) -> Check:
    """A check that the value names an importable callable ('fused' is the built-in trainer's)."""
    def problem(path: Any) -> str | None:
        if field_name == "train" and path == "fused":
            return None
        try:
            import_callable(path, field_name)
        except ValueError as exc:
            return str(exc).removeprefix(f"{field_name}: ")
        return None
    return problem


_POSITIVE = "must be a positive integer, got {value}"
_FINITE = "must be a finite number, got {value}"


def _positive(**options: Any) -> Field:
    return Field(kind=int, low=1, type_reason=_POSITIVE, range_reason=_POSITIVE, missing_reason="missing (a positive integer)",
                 **options)


def _finite(value: float) -> str | None:
    return None if math.isfinite(value) else _FINITE.format(value=repr(value))


def _number(**options: Any) -> Field:
    """A finite number, read as a float (a bool is not one)."""
    return Field(kind=(int, float), type_reason=_FINITE, convert=lambda v: float(v) if type(v) is int else v,
                 missing_reason="missing", checks=(_finite, *options.pop("checks", ())), **options)


def _range_problems(d: dict[str, Any]) -> list[tuple[str, str]]:
    low, high, log, step, kind = d["low"], d["high"], d["log"], d.get("step"), d.get("distribution", d.get("type"))
    if low >= high:
        return [("", f"low must be below high (low={low:g}, high={high:g})")]
    if log and low <= 0:
        return [("low", f"a log distribution needs low > 0, got {low:g}")]
    if step is not None and log:
        return [("step", "cannot be combined with log")]
    if kind == "int" and (low != int(low) or high != int(high)):
        return [("", "an int distribution needs integer low and high")]
    return []


_NEEDS_CHOICES = "a categorical distribution needs a non-empty list of choices"
_KIND = {"distribution": Field(), "type": Field()}
CATEGORICAL = Schema({**_KIND, "choices": Field(kind=list, required=True, missing_reason=_NEEDS_CHOICES,
                                                type_reason=_NEEDS_CHOICES,
                                                checks=(lambda v: None if v else _NEEDS_CHOICES,))},
                     unknown_reason="not a field of a categorical distribution")
NUMERIC = {kind: Schema({
    **_KIND, "low": _number(required=True), "high": _number(required=True),
    "log": Field(kind=bool, default=False, type_reason="must be true or false, got {value}"),
    "step": _number(nullable=True, checks=(lambda v: None if v > 0 else f"must be positive, got {v:g}",)),
}, unknown_reason=f"not a field of a{'n' if kind == 'int' else ''} {kind} distribution", checks=(_range_problems,))
    for kind in ("float", "int")}


def _distribution_schema(spec: Mapping[str, Any]) -> Schema:
    kind = spec.get("distribution", spec.get("type"))
    if kind == "categorical":
        return CATEGORICAL
    if kind in NUMERIC:
        return NUMERIC[kind]
    reason = f"unknown distribution {kind!r} (one of {', '.join(DISTRIBUTIONS)})"
    return Schema({}, closed=False, checks=(lambda _: [("distribution", reason)],))


def _name_problem(name: Any) -> str | None:
    if isinstance(name, str) and name and all(c.isalnum() or c in "-_." for c in name):
        return None
    return f"must be a non-empty name of letters, digits, '-', '_' or '.', got {name!r}"


def _fusion_problem(value: Any) -> str | None:
    positive = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if value == "auto" or positive else f"must be a positive integer, got {value!r}"


def _args(**options: Any) -> Field:
    return Field(kind=Mapping, type_reason="must be a mapping, got {value}", **options)


TUNE_SPEC = Schema({
    "name": Field(required=True, missing_reason=_name_problem(None) or "", checks=(_name_problem,)),
    "kind": Field(default="tune", choices=("tune",), choices_reason="a tuning job file has kind 'tune', got {value}"),
    **{key: Field(required=True, missing_reason="missing (an importable callable 'module:attr')",
                  checks=(_importable(key),)) for key in ("factory", "data")},
    "factory_args": _args(default={}), "data_args": _args(default={}),
    "train": Field(default="fused", checks=(_importable("train"),)),
    "objective": _args(default={}, schema=Schema({
        "direction": Field(default="minimize", choices=("minimize", "maximize"),
                           choices_reason="must be minimize or maximize, got {value}"),
        "metric": Field(default="loss", choices=("loss",), choices_reason="only 'loss' is measured, got {value}"),
    })),
    "space": _args(required=True, missing_reason="missing (a mapping of hyperparameters)",
                   values=_args(schema=_distribution_schema),
                   checks=(lambda v: None if v else "needs at least one hyperparameter",)),
    "budget": _args(required=True, missing_reason="missing (trials, steps, report_every)", schema=Schema({
        "trials": _positive(required=True), "steps": _positive(required=True), "report_every": _positive(),
    }, unknown_reason="unknown field (trials, steps, report_every)")),
    "scale": _positive(default=1),
    "fusion": Field(default="auto", checks=(_fusion_problem,)),
    "sampler": _args(default={}, schema=Schema({
        "type": Field(default="tpe", choices=("tpe",), choices_reason="only 'tpe' is supported, got {value}"),
        "seed": Field(kind=int, nullable=True, type_reason="must be an integer, got {value}"),
    })),
    "pruner": _args(default={}, schema=Schema({
        "type": Field(default="successive_halving", choices=PRUNERS, choices_reason="unknown pruner {value} (one of {choices})"),
        "min_resource": _positive(),
        "reduction_factor": _positive(default=3, checks=(lambda v: None if v >= 2 else f"must be at least 2, got {v}",)),
    })),
    "transfer": _args(default={}, schema=Schema({
        "at": _number(default=1.0, checks=(lambda v: None if 0 < v <= 1 else
                                          f"a share of the trial budget in (0, 1], got {v:g}",)),
        "steps": Field(default=0, checks=(lambda v: None if v == 0 else _positive_problem(v),)),
    })),
}, unknown_reason="unknown field (fields: {known})")


def _positive_problem(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else _POSITIVE.format(value=repr(value))


def parse_spec(data: Any) -> TuneSpec:
    """A checked :class:`TuneSpec` from a job file's parsed contents, or ValueError naming the field
    (a :class:`rota.core.schema.SchemaError`)."""
    doc = validate(TUNE_SPEC, _mapping(data, "job file"))
    budget, pruner, sampler, transfer = doc["budget"], doc["pruner"], doc["sampler"], doc["transfer"]
    report_every = budget.get("report_every", max(1, budget["steps"] // 5))
    space = {str(name): _distribution(str(name), raw) for name, raw in doc["space"].items()}
    return TuneSpec(
        name=doc["name"], factory=doc["factory"], data=doc["data"], space=space, trials=budget["trials"],
        steps=budget["steps"], report_every=report_every, scale=doc["scale"],
        fusion=None if doc["fusion"] == "auto" else doc["fusion"], direction=doc["objective"]["direction"],
        train=doc["train"], factory_args=dict(doc["factory_args"]), data_args=dict(doc["data_args"]),
        sampler_seed=sampler.get("seed"), pruner=pruner["type"], min_resource=pruner.get("min_resource", report_every),
        reduction_factor=pruner["reduction_factor"], transfer_at=transfer["at"], transfer_steps=transfer["steps"])


def _distribution(name: str, spec: dict[str, Any]) -> Distribution:
    kind = str(spec.get("distribution", spec.get("type")))
    if kind == "categorical":
        return Distribution(name, kind, choices=tuple(spec["choices"]))
    return Distribution(name, kind, low=spec["low"], high=spec["high"], log=spec["log"], step=spec.get("step"))
