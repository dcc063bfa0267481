"""A tuning study: Optuna (TPE + successive halving or Hyperband) through ask/tell, driving fused trials.

Each round asks for F trials (F from profiled memory, or the job file's cap), builds their
surrogates (the factory's model at 1/S width), groups them by architecture and trains every
group as one :class:`FusedTrials` batch. Every ``report_every`` steps each live trial's
held-out loss is told to Optuna as an intermediate value; a trial the pruner stops is dropped
from its batch. A trial whose factory raises, or whose loss stops being finite, is told
FAIL with its error (kept as the trial's ``error`` user attribute) and the study goes on.

Eager transfer: once ``transfer.at`` of the trial budget is done, the best configuration so
far trains at full scale (S = 1) for ``transfer.steps``; its loss is recorded with the study.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch
from torch import nn

from rota.jobkit.tuning.fused import (
    FusedTrials,
    TrialHparams,
    free_memory_bytes,
    fusion_count,
    profile_footprint,
)
from rota.jobkit.tuning.scaling import ScaledModel, scale_width
from rota.jobkit.tuning.space import TuneSpec, import_callable

__all__ = ["StudyResult", "run_study", "summarise"]

OPTIMIZER_KEYS = frozenset(TrialHparams.__dataclass_fields__)
MAX_FUSION = 16


@dataclass
class StudyResult:
    study: optuna.Study
    fusion: int
    transfer: dict[str, Any] | None = None
    footprints: dict[str, int] = field(default_factory=dict)


def _pruner(spec: TuneSpec) -> optuna.pruners.BasePruner:
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=spec.min_resource, reduction_factor=spec.reduction_factor)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec.min_resource, max_resource=spec.steps,
                                              reduction_factor=spec.reduction_factor)
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_warmup_steps=spec.min_resource)
    return optuna.pruners.NopPruner()


def _split(params: dict[str, Any]) -> tuple[TrialHparams, dict[str, Any]]:
    optim = {k: v for k, v in params.items() if k in OPTIMIZER_KEYS}
    optim.setdefault("lr", 1e-3)
    return TrialHparams.from_mapping(optim), {k: v for k, v in params.items() if k not in OPTIMIZER_KEYS}


class _Run:
    """One study's moving parts: the spec's callables, Optuna, the data."""

    def __init__(self, spec: TuneSpec, study: optuna.Study, on_change: Callable[[], None]) -> None:
        self.spec, self.study, self.on_change = spec, study, on_change
        self.factory = import_callable(spec.factory, "factory")
        data_factory = import_callable(spec.data, "data")
        self.data = data_factory(seed=spec.sampler_seed or 0, **spec.data_args)
        if not callable(getattr(self.data, "next", None)) or not callable(getattr(self.data, "eval_batch", None)):
            raise ValueError(f"data: {spec.data!r} must return an object with next() and eval_batch()")
        self.held_out = self.data.eval_batch()
        self.train_fn = None if spec.train == "fused" else import_callable(spec.train, "train")
        self.told: set[int] = set()

    def tell(self, trial: optuna.Trial, value: float | None = None,
             state: optuna.trial.TrialState = optuna.trial.TrialState.COMPLETE) -> None:
        self.told.add(trial.number)
        if state == optuna.trial.TrialState.COMPLETE:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)

    def surrogate(self, model_kwargs: dict[str, Any], factor: int, seed: int) -> ScaledModel:
        model = self.factory(**{**self.spec.factory_args, **model_kwargs})
        if not isinstance(model, nn.Module):
            raise ValueError(f"factory: {self.spec.factory!r} returned a {type(model).__name__}, not a torch.nn.Module")
        return scale_width(model, factor, seed=seed)

    def fail(self, trial: optuna.Trial, error: BaseException | str) -> None:
        trial.set_user_attr("error", error if isinstance(error, str) else f"{type(error).__name__}: {error}")
        self.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.on_change()

    def run_group(self, trials: list[optuna.Trial], models: list[ScaledModel], hparams: list[TrialHparams]) -> None:
        by_number = {t.number: t for t in trials}
        fused = FusedTrials(models, hparams, [t.number for t in trials])
        for step in range(1, self.spec.steps + 1):
            if not fused.ids:
                return
            losses = fused.step(self.data.next())
            bad = [n for n, v in zip(fused.ids, losses, strict=True) if not math.isfinite(v)]
            for n in bad:
                self.fail(by_number[n], f"loss became non-finite at step {step}")
            fused.drop(bad)
            if step % self.spec.report_every and step != self.spec.steps:
                continue
            pruned = []
            for n, loss in zip(fused.ids, fused.evaluate(self.held_out), strict=True):
                trial = by_number[n]
                if step == self.spec.steps:
                    if math.isfinite(loss):
                        self.tell(trial, loss)
                    else:
                        self.fail(trial, f"held-out loss is non-finite at step {step}")
                    continue
                trial.report(loss, step)
                if trial.should_prune():
                    self.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    pruned.append(n)
            fused.drop(pruned)
            self.on_change()

    def run_user_train(self, trial: optuna.Trial, model: ScaledModel, hparams: dict[str, Any]) -> None:
        assert self.train_fn is not None

        def report(step: int, loss: float) -> bool:
            trial.report(loss, step)
            return bool(trial.should_prune())

        try:
            loss = float(self.train_fn(model.module, hparams, self.spec.steps, report))
        except optuna.TrialPruned:
            self.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        if trial.should_prune():
            self.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif math.isfinite(loss):
            self.tell(trial, loss)
        else:
            self.fail(trial, "training returned a non-finite loss")
        self.on_change()

    def round(self, count: int) -> None:
        asked = [self.study.ask() for _ in range(count)]
        groups: dict[tuple[Any, ...], list[tuple[optuna.Trial, ScaledModel, TrialHparams]]] = {}
        for trial in asked:
            try:
                params = {name: dist.suggest(trial) for name, dist in self.spec.space.items()}
                hparams, model_kwargs = _split(params)
                model = self.surrogate(model_kwargs, self.spec.scale, seed=trial.number)
            except Exception as exc:  # the trial's own failure: record it, keep the study going
                self.fail(trial, exc)
                continue
            if self.train_fn is not None:
                try:
                    self.run_user_train(trial, model, params)
                except Exception as exc:
                    self.fail(trial, exc)
                continue
            shape = tuple((n, tuple(p.shape)) for n, p in model.module.named_parameters())
            groups.setdefault(shape, []).append((trial, model, hparams))
        for members in groups.values():
            try:
                self.run_group([m[0] for m in members], [m[1] for m in members], [m[2] for m in members])
            except Exception as exc:
                for trial, _, _ in members:
                    if trial.number not in self.told:
                        self.fail(trial, exc)

    def fusion_from_memory(self) -> tuple[int, dict[str, int]]:
        """F from the footprints of the base configuration at fusion 1 and 2 (see fused.profile_footprint)."""
        def make(count: int) -> FusedTrials:
            return FusedTrials([self.surrogate({}, self.spec.scale, seed=i) for i in range(count)], [TrialHparams(lr=1e-3)] * count)

        batch = self.data.next()
        m1, m2 = profile_footprint(make, batch, 1), profile_footprint(make, batch, 2)
        free = free_memory_bytes()
        return fusion_count(m1, m2, free, cap=MAX_FUSION), {"m1": m1, "m2": m2, "m_free": free}

    def transfer(self) -> dict[str, Any] | None:
        done = [t for t in self.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not done or self.spec.transfer_steps <= 0:
            return None
        best = min(done, key=lambda t: t.value or 0.0) if self.spec.direction == "minimize" else max(done, key=lambda t: t.value or 0.0)
        hparams, model_kwargs = _split(dict(best.params))
        started = time.monotonic()
        fused = FusedTrials([self.surrogate(model_kwargs, 1, seed=best.number)], [hparams], [best.number])
        for _ in range(self.spec.transfer_steps):
            fused.step(self.data.next())
        loss = fused.evaluate(self.held_out)[0]
        return {"trial": best.number, "params": dict(best.params), "steps": self.spec.transfer_steps,
                "loss": loss if math.isfinite(loss) else None, "seconds": time.monotonic() - started}


def run_study(spec: TuneSpec, study_id: str, storage: str | None = None,
              on_change: Callable[[optuna.Study, dict[str, Any]], None] | None = None) -> StudyResult:
    """Run the study to its trial budget; ``on_change`` sees the study after every told trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.manual_seed(spec.sampler_seed or 0)
    direction = optuna.study.StudyDirection.MINIMIZE if spec.direction == "minimize" else optuna.study.StudyDirection.MAXIMIZE
    study = optuna.create_study(study_name=study_id, storage=storage, direction=direction, load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=spec.sampler_seed),
                                pruner=_pruner(spec))
    extra: dict[str, Any] = {}
    run = _Run(spec, study, lambda: on_change(study, extra) if on_change else None)
    if spec.train == "fused":
        if spec.fusion is None:
            fusion, footprints = run.fusion_from_memory()
        else:
            fusion, footprints = spec.fusion, {}
    else:
        fusion, footprints = 1, {}
    extra.update({"fusion": fusion, "footprints": footprints})
    if fusion < 1:
        raise ValueError(f"fusion: one trial needs {footprints.get('m1')} bytes, only {footprints.get('m_free')} are free")
    result = StudyResult(study=study, fusion=fusion, footprints=footprints)
    asked = len(study.trials)
    transfer_after = math.ceil(spec.transfer_at * spec.trials)
    while asked < spec.trials:
        count = min(fusion, spec.trials - asked)
        if result.transfer is None and asked < transfer_after:
            count = min(count, transfer_after - asked)  # stop the round at the transfer point
        run.round(count)
        asked += count
        if result.transfer is None and asked >= transfer_after:
            result.transfer = run.transfer()
            extra["transfer"] = result.transfer
            if result.transfer is not None:
                study.set_user_attr("transfer", result.transfer)
            run.on_change()
    return result


def summarise(study: optuna.Study) -> dict[str, Any]:
    """The study as plain JSON data: trials, their hyperparameters and losses, the best so far."""
    trials: list[dict[str, Any]] = []
    for t in study.trials:
        trials.append({"number": t.number, "state": t.state.name.lower(), "params": dict(t.params), "value": t.value,
                       "intermediate": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                       "error": t.user_attrs.get("error")})
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best: dict[str, Any] | None = None
    if complete:
        chosen = study.best_trial
        best = {"number": chosen.number, "value": chosen.value, "params": dict(chosen.params)}
    counts: dict[str, int] = {}
    for t in study.trials:
        state = t.state.name.lower()
        counts[state] = counts.get(state, 0) + 1
    return {"id": study.study_name, "direction": study.direction.name.lower(), "trials": trials, "counts": counts,
            "best": best, "transfer": study.user_attrs.get("transfer")}
