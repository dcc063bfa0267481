"""A small byte-level transformer LM and its corpus: the Python standard library's own sources.

The corpus ships on every machine that runs Python, so the fidelity measurement needs no
download. The model is written so that the width pass in :mod:`rota.jobkit.tuning.scaling` can
shrink it: every width lives in a module's shape (``Linear``, ``Embedding``, ``LayerNorm``),
never in a constant of ``forward``; attention splits heads with ``view(B, T, heads, -1)``
so the head width follows the projection's width, and scores are scaled by
``attn_mult / head_dim`` (maximal-update attention: ``1/d`` rather than ``1/sqrt(d)``, with
``attn_mult = sqrt(head_dim)`` at full width so S = 1 is the ordinary transformer).
"""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

VOCAB = 256  # bytes


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        # A plain float, so FX keeps it as a constant and the width pass leaves it alone.
        self.attn_mult = math.sqrt(width / heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, -1).transpose(1, 2)
        k = k.view(b, t, self.heads, -1).transpose(1, 2)
        v = v.view(b, t, self.heads, -1).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (self.attn_mult / q.shape[-1])
        # Written out rather than scaled_dot_product_attention: vmap has a batching rule for
        # these ops, none for the fused CPU kernel, so fused trials stay one batched computation.
        future = x.new_ones((t, t), dtype=torch.bool).triu(1)
        out = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ff_mult: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.ff_in = nn.Linear(width, ff_mult * width)
        self.ff_out = nn.Linear(ff_mult * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ff_out(nn.functional.gelu(self.ff_in(self.ln2(x))))


class TinyLM(nn.Module):
    """Byte-level causal LM: token + position embeddings, pre-norm blocks, a linear readout."""

    def __init__(self, width: int = 128, layers: int = 2, heads: int = 4, context: int = 64, ff_mult: int = 4) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width: {width} is not a multiple of heads={heads}")
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads, ff_mult) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        return self.head(self.ln_f(self.blocks(x)))


def tiny_lm(width: int = 128, layers: int = 2, heads: int = 4, context: int = 64) -> TinyLM:
    """The default model factory of the tuning examples."""
    return TinyLM(width=width, layers=layers, heads=heads, context=context)


def stdlib_corpus(max_bytes: int = 2_000_000) -> torch.Tensor:
    """The bytes of the standard library's ``.py`` files, in a fixed (sorted) order, as uint8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not chunks:
        raise FileNotFoundError(f"no .py files under the standard library at {root}")
    blob = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()


class Batches:
    """Deterministic random windows of a corpus: the same seed gives the same batches.

    The last 10% of the corpus is held out for :meth:`eval_batch`.
    """

    def __init__(self, corpus: torch.Tensor, batch: int, context: int, seed: int) -> None:
        if corpus.numel() <= 2 * context + 2:
            raise ValueError(f"corpus: {corpus.numel()} bytes is too short for context={context}")
        split = int(corpus.numel() * 0.9)
        self.train = corpus[:split].long()
        self.held_out = corpus[split:].long()
        self.batch, self.context = batch, context
        self.generator = torch.Generator().manual_seed(seed)

    def _windows(self, data: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = torch.arange(self.context + 1)
        rows = data[starts[:, None] + offsets[None, :]]
        return rows[:, :-1], rows[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = self.train.numel() - self.context - 1
        starts = torch.randint(0, high, (self.batch,), generator=self.generator)
        return self._windows(self.train, starts)

    def eval_batch(self, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed held-out batch (the same for every call)."""
        high = self.held_out.numel() - self.context - 1
        starts = torch.linspace(0, high - 1, size).long()
        return self._windows(self.held_out, starts)


def stdlib_batches(seed: int = 0, batch: int = 16, context: int = 64, max_bytes: int = 2_000_000) -> Batches:
    """The default data factory of the tuning examples."""
    return Batches(stdlib_corpus(max_bytes), batch, context, seed)
