"""Surrogate models: an FX pass that divides a model's width by S, with maximal-update rules.

The pass traces the model with ``torch.fx`` and rebuilds every ``Linear``, ``Embedding``,
``LayerNorm`` and ``RMSNorm`` at 1/S of its width. Two dimensions are not widths and stay:
the *input layer's fan-in* (an embedding's vocabulary, or the ``in_features`` of a Linear
fed straight from a graph input) and the *output layer's fan-out* (the ``out_features`` of
a Linear whose result is the graph's output). Attention and feed-forward widths shrink with
the projections that carry them, provided ``forward`` reads head widths from tensor shapes
(``view(B, T, heads, -1)``), as :class:`rota.jobkit.tuning.lm.TinyLM` does.

So that a configuration ranks the same at width 1/S as at full width, the pass applies the
maximal-update parametrisation (muP, Yang et al., "Tensor Programs V"), with the full model
as the base shape (width multiplier ``m = 1/S``):

- the readout is multiplied by ``output_mult / m = output_mult * S`` (a buffer, so fused
  trials may each hold their own) and initialised at zero;
- hidden weights keep the fan-in initialisation (std ~ 1/sqrt(fan_in)); embeddings N(0, 1);
- learning rates per optimizer: Adam(W) scales *matrix-like* parameters (both dimensions
  are widths) by ``1/m`` and leaves *vector-like* ones (biases, norms, embeddings, readout:
  one width dimension) alone; SGD scales vector-like parameters by ``m`` and matrix-like ones
  by ``fanout_mult / fanin_mult`` (1 for the hidden layers here).

At S = 1 the pass returns the same architecture in the same parametrisation, so S = 1 is the
reference the surrogates are compared against.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import fx, nn

__all__ = ["READOUT_MULT", "ScaledModel", "scale_width"]

#: The buffer holding the readout multiplier, ``output_mult * S``.
READOUT_MULT = "readout_mult"

Optimizer = Literal["adam", "adamw", "sgd"]


@dataclass
class ScaledModel:
    """The surrogate, and how each of its parameters scales with width."""

    module: fx.GraphModule
    factor: int
    # Per parameter name, one flag per dimension: True where the dimension is a width.
    width_dims: dict[str, tuple[bool, ...]] = field(default_factory=dict)

    def kind(self, name: str) -> str:
        """``matrix`` (two width dims), ``vector`` (one) or ``scalar`` (none)."""
        n = sum(self.width_dims.get(name, ()))
        return "matrix" if n >= 2 else "vector" if n == 1 else "scalar"

    def lr_multipliers(self, optimizer: Optimizer = "adam") -> dict[str, float]:
        """Per parameter, the factor its learning rate is multiplied by at this width."""
        m = 1.0 / self.factor
        out: dict[str, float] = {}
        for name, _ in self.module.named_parameters():
            kind = self.kind(name)
            if optimizer in ("adam", "adamw"):
                out[name] = 1.0 / m if kind == "matrix" else 1.0
            elif optimizer == "sgd":
                # Hidden matrices: fan-out and fan-in both scale by m, so the ratio is 1.
                out[name] = m if kind == "vector" else 1.0
            else:
                raise ValueError(f"optimizer: {optimizer!r} is not one of adam, adamw, sgd")
        return out

    def param_groups(self, lr: float, optimizer: Optimizer = "adam", weight_decay: float = 0.0) -> list[dict[str, object]]:
        """``torch.optim`` parameter groups with the muP learning rates (and weight decay)."""
        mults = self.lr_multipliers(optimizer)
        groups: dict[float, list[nn.Parameter]] = {}
        for name, p in self.module.named_parameters():
            groups.setdefault(mults[name], []).append(p)
        out: list[dict[str, object]] = []
        for mult, params in groups.items():
            # Decoupled weight decay is applied as lr * wd, so scale it inversely to keep it width-free.
            wd = weight_decay / mult if optimizer == "adamw" else weight_decay
            out.append({"params": params, "lr": lr * mult, "weight_decay": wd})
        return out

    def set_output_mult(self, output_mult: float) -> None:
        getattr(self.module, READOUT_MULT).fill_(output_mult * self.factor)


def _shrink(size: int, factor: int, what: str) -> int:
    if size % factor:
        raise ValueError(f"{what}: width {size} is not divisible by S={factor}")
    return size // factor


def _input_and_output_linears(graph: fx.Graph) -> tuple[set[str], set[str]]:
    """Linear call sites fed straight from a graph input, and those whose result is the output."""
    placeholders = {n for n in graph.nodes if n.op == "placeholder"}
    output = next(n for n in graph.nodes if n.op == "output")
    inputs: set[str] = set()
    outputs: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        if node.args and node.args[0] in placeholders:
            inputs.add(str(node.target))
        if output in node.users:
            outputs.add(str(node.target))
    return inputs, outputs


def _rebuilt(module: nn.Module, name: str, factor: int, keep_in: bool, keep_out: bool) -> tuple[nn.Module, dict[str, tuple[bool, ...]]]:
    """The module at 1/factor width and, per parameter, which dimensions are widths."""
    if isinstance(module, nn.Linear):
        fan_in = module.in_features if keep_in else _shrink(module.in_features, factor, f"{name}.in_features")
        fan_out = module.out_features if keep_out else _shrink(module.out_features, factor, f"{name}.out_features")
        linear = nn.Linear(fan_in, fan_out, bias=module.bias is not None)
        dims: dict[str, tuple[bool, ...]] = {"weight": (not keep_out, not keep_in)}
        if module.bias is not None:
            dims["bias"] = (not keep_out,)
        if keep_out:
            nn.init.zeros_(linear.weight)  # muP readout: zero init (the multiplier sets its scale)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        return linear, dims
    if isinstance(module, nn.Embedding):
        dim = _shrink(module.embedding_dim, factor, f"{name}.embedding_dim")
        return nn.Embedding(module.num_embeddings, dim, padding_idx=module.padding_idx), {"weight": (False, True)}
    if isinstance(module, nn.LayerNorm | nn.RMSNorm):
        shape = tuple(module.normalized_shape)
        new_shape = (*shape[:-1], _shrink(shape[-1], factor, f"{name}.normalized_shape"))
        affine = module.elementwise_affine
        norm: nn.Module
        if isinstance(module, nn.LayerNorm):
            norm = nn.LayerNorm(new_shape, eps=module.eps, elementwise_affine=affine, bias=module.bias is not None)
        else:
            norm = nn.RMSNorm(new_shape, eps=module.eps, elementwise_affine=affine)
        dims = {}
        if affine:
            dims["weight"] = tuple([False] * (len(shape) - 1) + [True])
            if getattr(module, "bias", None) is not None:
                dims["bias"] = dims["weight"]
        return norm, dims
    raise TypeError(f"{name}: cannot rescale a {type(module).__name__}")


_RESCALED = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm)


def scale_width(model: nn.Module, factor: int, output_mult: float = 1.0, seed: int | None = None) -> ScaledModel:
    """The model at 1/factor of its width, in the maximal-update parametrisation.

    ``model`` is not changed. ``seed`` fixes the fresh initialisation of the rebuilt layers.
    Parameters held directly by modules other than the ones rebuilt (a bare ``nn.Parameter``)
    are refused: the pass cannot tell which of their dimensions are widths.
    """
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
        raise ValueError(f"factor: S must be a positive integer, got {factor!r}")
    if seed is not None:
        torch.manual_seed(seed)
    gm = fx.symbolic_trace(copy.deepcopy(model))
    inputs, outputs = _input_and_output_linears(gm.graph)
    if not outputs:
        raise ValueError("model: no Linear produces the graph's output; the pass needs a readout layer")
    width_dims: dict[str, tuple[bool, ...]] = {}
    for name, module in list(gm.named_modules()):
        if not isinstance(module, _RESCALED):
            for pname, _ in module.named_parameters(recurse=False):
                raise ValueError(f"{name}.{pname}: a bare parameter on a {type(module).__name__}; cannot tell its widths")
            continue
        new, dims = _rebuilt(module, name, factor, keep_in=name in inputs, keep_out=name in outputs)
        parent_name, _, child = name.rpartition(".")
        setattr(gm.get_submodule(parent_name), child, new)
        width_dims.update({f"{name}.{p}": d for p, d in dims.items()})
    gm.register_buffer(READOUT_MULT, torch.tensor(float(output_mult * factor)))
    _multiply_readouts(gm, outputs)
    return ScaledModel(module=gm, factor=factor, width_dims=width_dims)


def _multiply_readouts(gm: fx.GraphModule, outputs: set[str]) -> None:
    """Rewrite ``y = head(x)`` into ``y = head(x) * readout_mult`` for each readout call."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target) in outputs:
            with graph.inserting_after(node):
                mult = graph.get_attr(READOUT_MULT)
            with graph.inserting_after(mult):
                scaled = graph.call_function(operator.mul, (node, mult))
            node.replace_all_uses_with(scaled, delete_user_cb=lambda user, keep=scaled: user is not keep)
    graph.lint()
    gm.recompile()
