"""Fused trials: B trials of one surrogate architecture trained as one batched computation.

The B models' weights are stacked along a new leading dimension
(as ``torch.func.stack_module_state`` does) and the forward runs once under ``torch.func.vmap``, so
each layer is one batched matmul over the trials. Every trial keeps its own hyperparameters
(learning rate, Adam's beta1/beta2, weight decay, readout multiplier: all are tensors with a
trial dimension) and its own loss; gradients do not mix because the trials share no weight,
so one ``backward`` of the summed losses gives each trial its own gradient. The optimizer is
AdamW written over the stacked tensors with the same arithmetic as ``torch.optim.AdamW``,
with each parameter's muP learning-rate multiplier from :class:`ScaledModel`.

A pruned trial is removed from the stacks (weights, optimizer state, hyperparameters), so it
stops costing compute at the next step.

The fusion count comes from profiled memory: F <= floor((M_free - m1) / (m2 - m1)), with m1, m2
the footprints of one training step at fusion 1 and 2 (:func:`profile_footprint`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from rota.jobkit.tuning.scaling import READOUT_MULT, ScaledModel

__all__ = ["FusedTrials", "TrialHparams", "fusion_count", "free_memory_bytes", "profile_footprint"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TrialHparams:
    """The hyperparameters one fused trial may hold on its own."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    output_mult: float = 1.0
    eps: float = 1e-8

    @classmethod
    def from_mapping(cls, values: Mapping[str, float]) -> TrialHparams:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: not a fused-trial hyperparameter (known: {', '.join(sorted(known))})")
        if "lr" not in values:
            raise ValueError("lr: a fused trial needs a learning rate")
        return cls(**{k: float(v) for k, v in values.items()})


class FusedTrials:
    """B trials, one batched model; ``step`` trains all live trials once and returns their losses."""

    def __init__(self, models: Sequence[ScaledModel], hparams: Sequence[TrialHparams], trial_ids: Sequence[int] | None = None) -> None:
        if not models or len(models) != len(hparams):
            raise ValueError(f"hparams: {len(hparams)} hyperparameter sets for {len(models)} models")
        shapes = [tuple((n, tuple(p.shape)) for n, p in m.module.named_parameters()) for m in models]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("models: fused trials must share one architecture (parameter shapes differ)")
        self.ids = list(trial_ids) if trial_ids is not None else list(range(len(models)))
        modules = [m.module for m in models]
        for m, hp in zip(models, hparams, strict=True):
            with torch.no_grad():
                getattr(m.module, READOUT_MULT).fill_(hp.output_mult * m.factor)
        # Each traced GraphModule is its own class, so torch.func.stack_module_state (which
        # insists on one class) does not apply; stacking by name is the same operation.
        self.params: dict[str, torch.Tensor] = {
            n: torch.stack([dict(m.named_parameters())[n].detach() for m in modules]).requires_grad_(True)
            for n, _ in modules[0].named_parameters()}
        self.buffers: dict[str, torch.Tensor] = {
            n: torch.stack([dict(m.named_buffers())[n] for m in modules]) for n, _ in modules[0].named_buffers()}
        # A stateless copy to call functionally: its own tensors are never read.
        self.base = copy.deepcopy(modules[0]).to("meta")
        self.lr_mult = models[0].lr_multipliers("adamw")
        self.hp = {f: torch.tensor([getattr(h, f) for h in hparams]) for f in ("lr", "beta1", "beta2", "weight_decay", "eps")}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.steps = 0

    @property
    def size(self) -> int:
        return len(self.ids)

    def _losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def one(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = functional_call(self.base, (params, buffers), (x,))
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        return vmap(one)(self.params, self.buffers)  # type: ignore[no-any-return]

    def step(self, batch: Batch) -> list[float]:
        """One AdamW step of every live trial on the same batch; their training losses."""
        if not self.ids:
            return []
        x, y = batch
        losses = self._losses(x, y)
        grads = torch.autograd.grad(losses.sum(), list(self.params.values()))
        self.steps += 1
        with torch.no_grad():
            for (name, p), g in zip(self.params.items(), grads, strict=True):
                self._adamw(name, p, g)
        return [float(v) for v in losses.detach()]

    def _per_trial(self, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return values.view(-1, *([1] * (like.dim() - 1)))

    def _adamw(self, name: str, p: torch.Tensor, g: torch.Tensor) -> None:
        # The same arithmetic as torch.optim.AdamW (single-tensor path), with a trial dimension.
        lr = self._per_trial(self.hp["lr"] * self.lr_mult[name], p)
        wd = self._per_trial(self.hp["weight_decay"] / self.lr_mult[name], p)
        beta1 = self._per_trial(self.hp["beta1"], p)
        beta2 = self._per_trial(self.hp["beta2"], p)
        eps = self._per_trial(self.hp["eps"], p)
        p.mul_(1 - lr * wd)
        m, v = self.exp_avg[name], self.exp_avg_sq[name]
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g * (1 - beta2))
        bc1 = 1 - beta1**self.steps
        bc2 = 1 - beta2**self.steps
        denom = (v.sqrt() / bc2.sqrt()).add_(eps)
        p.addcdiv_(m, denom * bc1 / lr, value=-1.0)

    def evaluate(self, batch: Batch) -> list[float]:
        """Each live trial's loss on a batch, without training."""
        if not self.ids:
            return []
        with torch.no_grad():
            return [float(v) for v in self._losses(*batch)]

    def drop(self, trial_ids: Sequence[int]) -> None:
        """Remove trials (pruned, failed) from the batch: they cost nothing from the next step."""
        gone = set(trial_ids)
        keep = [i for i, t in enumerate(self.ids) if t not in gone]
        if len(keep) == len(self.ids):
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.ids = [self.ids[i] for i in keep]
        self.params = {n: p.detach()[index].clone().requires_grad_(True) for n, p in self.params.items()}
        self.buffers = {n: b[index].clone() for n, b in self.buffers.items()}
        self.exp_avg = {n: t[index].clone() for n, t in self.exp_avg.items()}
        self.exp_avg_sq = {n: t[index].clone() for n, t in self.exp_avg_sq.items()}
        self.hp = {n: t[index].clone() for n, t in self.hp.items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the batch (a paused trial resumes from its state)."""
        return {"ids": list(self.ids), "steps": self.steps, "params": {n: p.detach().clone() for n, p in self.params.items()},
                "buffers": dict(self.buffers), "exp_avg": dict(self.exp_avg), "exp_avg_sq": dict(self.exp_avg_sq), "hp": dict(self.hp)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (same architecture): the next step continues the saved trajectories."""
        params = state["params"]
        if set(params) != set(self.params):
            raise ValueError("state.params: the saved batch has other parameters than this model")
        self.ids, self.steps = list(state["ids"]), int(state["steps"])
        self.params = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        for key in ("buffers", "exp_avg", "exp_avg_sq", "hp"):
            setattr(self, key, {n: t.clone() for n, t in state[key].items()})


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def profile_footprint(make: Callable[[int], FusedTrials], batch: Batch, fusion: int) -> int:
    """Bytes one training step needs at a fusion count: weights, gradients, AdamW state, saved activations.

    On a GPU, ``torch.cuda.max_memory_allocated`` around one step says the same; on the CPU
    torch keeps no allocator statistics, so the activations are counted as the distinct
    storages autograd saves for backward (``saved_tensors_hooks``), plus the logits.
    """
    fused = make(fusion)
    state = sum(_tensor_bytes(p) for p in fused.params.values()) * 4  # weight, grad, exp_avg, exp_avg_sq
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        losses = fused._losses(*batch)
    activations = sum(seen.values())
    param_ptrs = {p.untyped_storage().data_ptr() for p in fused.params.values()}
    activations -= sum(n for ptr, n in seen.items() if ptr in param_ptrs)
    del losses
    return state + activations


def free_memory_bytes() -> int:
    """M_free: the device's free memory (``cuda.mem_get_info``), else the host's MemAvailable."""
    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def fusion_count(m1: int, m2: int, free: int, cap: int | None = None) -> int:
    """F = floor((M_free - m1) / (m2 - m1)), at least 1 when one trial fits, at most ``cap``."""
    if m1 <= 0 or m2 <= m1:
        raise ValueError(f"m2: the footprint at fusion 2 ({m2}) must exceed that at fusion 1 ({m1})")
    if free < m1:
        return 0
    count = max(1, math.floor((free - m1) / (m2 - m1)))
    return min(count, cap) if cap is not None else count
