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

__all__ = ["Distribution", "TuneSpec", "import_callable", "parse_spec"]

DISTRIBUTIONS = ("float", "int", "categorical")
PRUNERS = ("successive_halving", "hyperband", "median", "none")
TOP_LEVEL = ("name", "kind", "factory", "factory_args", "data", "data_args", "train", "objective", "space", "budget",
             "scale", "fusion", "sampler", "pruner", "transfer")


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


def _number(value: Any, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field_name}: must be a finite number, got {value!r}")
    return float(value)


def _positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field_name}: must be a positive integer, got {value!r}")
    return value


def _distribution(name: str, raw: Any) -> Distribution:
    where = f"space.{name}"
    spec = _mapping(raw, where)
    kind = spec.get("distribution", spec.get("type"))
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"{where}.distribution: unknown distribution {kind!r} (one of {', '.join(DISTRIBUTIONS)})")
    allowed = {"distribution", "type", "choices"} if kind == "categorical" else {"distribution", "type", "low", "high", "log", "step"}
    for key in spec:
        if key not in allowed:
            raise ValueError(f"{where}.{key}: not a field of a {kind} distribution")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{where}.choices: a categorical distribution needs a non-empty list of choices")
        return Distribution(name, kind, choices=tuple(choices))
    for key in ("low", "high"):
        if key not in spec:
            raise ValueError(f"{where}.{key}: missing")
    low, high = _number(spec["low"], f"{where}.low"), _number(spec["high"], f"{where}.high")
    if low >= high:
        raise ValueError(f"{where}: low must be below high (low={low:g}, high={high:g})")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"{where}.log: must be true or false, got {log!r}")
    if log and low <= 0:
        raise ValueError(f"{where}.low: a log distribution needs low > 0, got {low:g}")
    step = spec.get("step")
    if step is not None:
        step = _number(step, f"{where}.step")
        if step <= 0:
            raise ValueError(f"{where}.step: must be positive, got {step:g}")
        if log:
            raise ValueError(f"{where}.step: cannot be combined with log")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise ValueError(f"{where}: an int distribution needs integer low and high")
    return Distribution(name, kind, low=low, high=high, log=log, step=step)


def parse_spec(data: Any) -> TuneSpec:
    """A checked :class:`TuneSpec` from a job file's parsed contents, or ValueError naming the field."""
    doc = _mapping(data, "job file")
    for key in doc:
        if key not in TOP_LEVEL:
            raise ValueError(f"{key}: unknown field (fields: {', '.join(TOP_LEVEL)})")
    if doc.get("kind", "tune") != "tune":
        raise ValueError(f"kind: a tuning job file has kind 'tune', got {doc.get('kind')!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"name: must be a non-empty name of letters, digits, '-', '_' or '.', got {name!r}")
    for key in ("factory", "data"):
        if key not in doc:
            raise ValueError(f"{key}: missing (an importable callable 'module:attr')")
        import_callable(doc[key], key)
    train = doc.get("train", "fused")
    if train != "fused":
        import_callable(train, "train")
    raw_space = _mapping(doc.get("space"), "space")
    if not raw_space:
        raise ValueError("space: needs at least one hyperparameter")
    space = {str(k): _distribution(str(k), v) for k, v in raw_space.items()}
    budget = _mapping(doc.get("budget"), "budget")
    for key in budget:
        if key not in ("trials", "steps", "report_every"):
            raise ValueError(f"budget.{key}: unknown field (trials, steps, report_every)")
    trials = _positive_int(budget.get("trials"), "budget.trials")
    steps = _positive_int(budget.get("steps"), "budget.steps")
    report_every = _positive_int(budget.get("report_every", max(1, steps // 5)), "budget.report_every")
    objective = _mapping(doc.get("objective", {}), "objective")
    direction = objective.get("direction", "minimize")
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"objective.direction: must be minimize or maximize, got {direction!r}")
    if objective.get("metric", "loss") != "loss":
        raise ValueError(f"objective.metric: only 'loss' is measured, got {objective.get('metric')!r}")
    scale = _positive_int(doc.get("scale", 1), "scale")
    fusion_raw = doc.get("fusion", "auto")
    fusion = None if fusion_raw == "auto" else _positive_int(fusion_raw, "fusion")
    sampler = _mapping(doc.get("sampler", {}), "sampler")
    if sampler.get("type", "tpe") != "tpe":
        raise ValueError(f"sampler.type: only 'tpe' is supported, got {sampler.get('type')!r}")
    seed = sampler.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"sampler.seed: must be an integer, got {seed!r}")
    pruner = _mapping(doc.get("pruner", {}), "pruner")
    pruner_type = pruner.get("type", "successive_halving")
    if pruner_type not in PRUNERS:
        raise ValueError(f"pruner.type: unknown pruner {pruner_type!r} (one of {', '.join(PRUNERS)})")
    min_resource = _positive_int(pruner.get("min_resource", report_every), "pruner.min_resource")
    reduction = _positive_int(pruner.get("reduction_factor", 3), "pruner.reduction_factor")
    if reduction < 2:
        raise ValueError(f"pruner.reduction_factor: must be at least 2, got {reduction}")
    transfer = _mapping(doc.get("transfer", {}), "transfer")
    at = _number(transfer.get("at", 1.0), "transfer.at")
    if not 0 < at <= 1:
        raise ValueError(f"transfer.at: a share of the trial budget in (0, 1], got {at:g}")
    transfer_steps = transfer.get("steps", 0)
    if transfer_steps != 0:
        _positive_int(transfer_steps, "transfer.steps")
    return TuneSpec(
        name=name, factory=doc["factory"], data=doc["data"], space=space, trials=trials, steps=steps,
        report_every=report_every, scale=scale, fusion=fusion, direction=direction, train=train,
        factory_args=dict(_mapping(doc.get("factory_args", {}), "factory_args")),
        data_args=dict(_mapping(doc.get("data_args", {}), "data_args")), sampler_seed=seed, pruner=pruner_type,
        min_resource=min_resource, reduction_factor=reduction, transfer_at=at, transfer_steps=int(transfer_steps))
