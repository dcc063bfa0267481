"""Model-parallel example blocks whose collectives are explicit functional collectives.

Each block is a plain function of tensors (activations and this rank's weight shards are all
inputs, so a trace holds them as placeholders) that calls
``torch.distributed._functional_collectives``; :func:`rota.jobkit.overlap.capture.capture` traces it
to an FX graph in which every collective is a ``_c10d_functional`` node followed by its
``wait_tensor``. A block also says which input dimension is its batch dimension (None for a
weight) and which output dimension is, which is what tiling needs.

The four blocks (sizes from :class:`BlockSize`):

- ``tp_mlp``: Megatron tensor-parallel MLP, x replicated ``[B, S, D]``, column-parallel
  ``w1 [D, H/n]``, row-parallel ``w2 [H/n, D]``, one all_reduce.
- ``tp_attn``: tensor-parallel attention over ``heads/n`` local heads, row-parallel output
  projection, one all_reduce.
- ``sp_mlp``: sequence-parallel MLP in Megatron's sequence-first layout ``[S/n, B, D]``:
  all_gather along the sequence, the tensor-parallel MLP, reduce_scatter along the sequence.
- ``ep_moe``: expert-parallel top-1 mixture of experts, one expert per rank, dense dispatch
  with capacity = all local tokens (nothing dropped, so every shape is static), an
  all_to_all to the experts and one back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

__all__ = ["BLOCK_NAMES", "Block", "BlockSize", "make_block"]

BLOCK_NAMES = ("tp_mlp", "tp_attn", "sp_mlp", "ep_moe")

StepFn = Callable[..., tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class BlockSize:
    """Shapes of one block's step: batch, sequence, model width, hidden width, heads."""

    batch: int = 8
    seq: int = 64
    model: int = 256
    hidden: int = 1024
    heads: int = 8

    def check(self, world: int) -> None:
        for field in ("batch", "seq", "model", "hidden", "heads"):
            if getattr(self, field) <= 0:
                raise ValueError(f"block size {field} must be positive, got {getattr(self, field)}")
        if self.hidden % world:
            raise ValueError(f"block size hidden={self.hidden} must divide by the {world} ranks")
        if self.heads % world or self.model % self.heads:
            raise ValueError(f"block size heads={self.heads} must divide by the {world} ranks and divide model={self.model}")
        if self.seq % world:
            raise ValueError(f"block size seq={self.seq} must divide by the {world} ranks (sequence parallelism)")


@dataclass(frozen=True)
class Block:
    """One example block on one rank: its step function, inputs, and batch dimensions."""

    name: str
    step: StepFn
    inputs: tuple[torch.Tensor, ...]
    batch_dims: tuple[int | None, ...]
    out_batch_dims: tuple[int, ...]


def _tp_mlp(group: dist.ProcessGroup) -> StepFn:
    def step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        partial = torch.nn.functional.gelu(x @ w1) @ w2
        return (fc.all_reduce(partial, "sum", group),)
    return step


def _tp_attn(group: dist.ProcessGroup, local_heads: int) -> StepFn:
    def step(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
             wo: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, local_heads, -1).transpose(1, 2)

        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        scores = torch.softmax(q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5), dim=-1)
        context = (scores @ v).transpose(1, 2).reshape(b, s, -1)
        return (fc.all_reduce(context @ wo, "sum", group),)
    return step


def _sp_mlp(group: dist.ProcessGroup) -> StepFn:
    def step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = fc.all_gather_single(x, 0, group)  # [S, B, D] from [S/n, B, D]
        partial = torch.nn.functional.gelu(full @ w1) @ w2
        return (fc.reduce_scatter_single(partial, "sum", 0, group),)
    return step


def _ep_moe(group: dist.ProcessGroup, experts: int) -> StepFn:
    def step(x: torch.Tensor, gate: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        probs = torch.softmax(tokens @ gate, dim=-1)
        weight, choice = probs.max(dim=-1)
        onehot = (choice[:, None] == torch.arange(experts)[None, :]).to(x.dtype)  # [T, E]
        dispatch = onehot.t()[:, :, None] * tokens[None, :, :]  # [E, T, D]: row e goes to expert e's rank
        received = fc.all_to_all_single(dispatch, None, None, group)  # [E(source ranks), T, D]
        expert_out = torch.nn.functional.gelu(received @ w1) @ w2
        returned = fc.all_to_all_single(expert_out, None, None, group)  # [E(experts), T, D]
        combined = (returned * (onehot * weight[:, None]).t()[:, :, None]).sum(dim=0)
        return (combined.reshape(b, s, d),)
    return step


def make_block(name: str, group: dist.ProcessGroup, rank: int, world: int, size: BlockSize | None = None,
               seed: int = 0) -> Block:
    """Build block ``name`` for ``rank`` of ``world`` on process group ``group``.

    Replicated inputs (the tensor-parallel activations, the MoE gate) come from ``seed``
    alone so every rank holds the same values; shards and per-rank data also use the rank.
    """
    if name not in BLOCK_NAMES:
        raise ValueError(f"block name {name!r} is not one of {', '.join(BLOCK_NAMES)}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"block rank={rank} must lie in [0, world={world})")
    size = size or BlockSize()
    size.check(world)
    shared = torch.Generator().manual_seed(seed)
    local = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
    b, s, d, h = size.batch, size.seq, size.model, size.hidden

    def rand(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    if name == "tp_mlp":
        x = rand(shared, b, s, d)
        return Block(name, _tp_mlp(group), (x, rand(local, d, h // world, scale=d ** -0.5),
                                            rand(local, h // world, d, scale=h ** -0.5)), (0, None, None), (0,))
    if name == "tp_attn":
        x = rand(shared, b, s, d)
        part = d // world
        weights = tuple(rand(local, d, part, scale=d ** -0.5) for _ in range(3))
        wo = rand(local, part, d, scale=d ** -0.5)
        return Block(name, _tp_attn(group, size.heads // world), (x, *weights, wo),
                     (0, None, None, None, None), (0,))
    if name == "sp_mlp":
        x = rand(local, s // world, b, d)
        return Block(name, _sp_mlp(group), (x, rand(local, d, h // world, scale=d ** -0.5),
                                            rand(local, h // world, d, scale=h ** -0.5)), (1, None, None), (1,))
    x = rand(local, b, s, d)
    gate = rand(shared, d, world)
    return Block(name, _ep_moe(group, world), (x, gate, rand(local, d, h, scale=d ** -0.5),
                                               rand(local, h, d, scale=h ** -0.5)), (0, None, None, None), (0,))
