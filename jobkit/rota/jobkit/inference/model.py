"""A small decoder-only transformer that reads and writes a paged KV cache.

One forward call runs a step of continuous batching: the new tokens of every scheduled
sequence (a decode's one token, or a prefill chunk) are concatenated; each layer writes
their keys and values into the pool at the slots the block tables give, then attends over
each sequence's whole context gathered back from the pool. Decodes are attended together
(one padded gather); prefill chunks one by one with a causal mask offset by what is
already cached. Weights are random with a fixed seed: the engine's cost and its cache
behaviour are what matter here, and two runs with the same seed give the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn

__all__ = ["ModelConfig", "SeqChunk", "TinyDecoder"]


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    d_model: int = 512
    layers: int = 1
    heads: int = 8
    kv_heads: int = 2  # grouped-query attention, as Qwen3 and Llama 3 (fewer KV bytes a token)
    ffn: int = 2048
    max_positions: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "ffn", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ValueError(f"heads: {self.heads} does not divide d_model {self.d_model}")
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads: must divide heads ({self.heads}), got {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a step: ``length`` new tokens starting at ``start`` in the
    step's flat token tensor; ``context_slots`` are the pool slots of every position up to
    and including its last new token (the cached prefix first)."""

    start: int
    length: int
    context_slots: torch.Tensor


class _Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.kv_dim)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.ffn)
        self.down = nn.Linear(cfg.ffn, cfg.d_model)

    def forward(self, x: torch.Tensor, slots: torch.Tensor, chunks: list[SeqChunk], kv: torch.Tensor) -> torch.Tensor:
        n_tokens = x.shape[0]
        h = self.norm1(x)
        q = self.q(h).view(n_tokens, self.heads, self.head_dim)
        k, v = self.kv(h).view(n_tokens, 2, -1).unbind(1)
        keys, values = kv[0], kv[1]
        keys.index_copy_(0, slots, k)  # the pool is flat: [slots, kv_heads * head_dim]
        values.index_copy_(0, slots, v)
        attended = torch.empty_like(q)
        decodes = [c for c in chunks if c.length == 1]
        if decodes:
            attended[torch.tensor([c.start for c in decodes])] = self._decode(q, decodes, keys, values)
        for c in chunks:
            if c.length > 1:
                attended[c.start:c.start + c.length] = self._prefill(q[c.start:c.start + c.length], c, keys, values)
        x = x + self.out(attended.reshape(n_tokens, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def _decode(self, q: torch.Tensor, chunks: list[SeqChunk], keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        longest = max(c.context_slots.numel() for c in chunks)
        index = torch.nn.utils.rnn.pad_sequence([c.context_slots for c in chunks], batch_first=True)
        lengths = torch.tensor([c.context_slots.numel() for c in chunks])
        mask = torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)
        shape = (len(chunks), longest, self.kv_heads, self.head_dim)
        kk = keys.index_select(0, index.view(-1)).view(shape).transpose(1, 2)  # [seqs, heads, context, head_dim]
        vv = values.index_select(0, index.view(-1)).view(shape).transpose(1, 2)
        qq = q[torch.tensor([c.start for c in chunks])].unsqueeze(2)  # [seqs, heads, 1, head_dim]
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask[:, None, None, :], enable_gqa=True)
        return out.squeeze(2)

    def _prefill(self, q: torch.Tensor, chunk: SeqChunk, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        context = chunk.context_slots.numel()
        shape = (context, self.kv_heads, self.head_dim)
        kk = keys.index_select(0, chunk.context_slots).view(shape).transpose(0, 1)  # [heads, context, head_dim]
        vv = values.index_select(0, chunk.context_slots).view(shape).transpose(0, 1)
        cached = context - chunk.length
        rows = torch.arange(chunk.length).unsqueeze(1) + cached
        mask = torch.arange(context).unsqueeze(0) <= rows  # causal, offset by the cached prefix
        out = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask, enable_gqa=True)
        return out.transpose(0, 1)


class TinyDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)
        for p in self.parameters():  # a larger spread than the default, so greedy tokens vary
            if p.dim() > 1:
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]))
        torch.random.set_rng_state(generator_state)
        self.eval()

    def new_pool(self, num_slots: int) -> torch.Tensor:
        """The preallocated KV pool: [layers, 2, slots, kv_heads * head_dim]."""
        c = self.cfg
        return torch.zeros(c.layers, 2, num_slots, c.kv_dim)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                chunks: list[SeqChunk], pool: torch.Tensor) -> torch.Tensor:
        """Logits of each chunk's last token: [len(chunks), vocab]."""
        if int(positions.max()) >= self.cfg.max_positions:
            raise ValueError(f"max_positions: a sequence reached position {int(positions.max())}")
        x = self.embed(tokens) + self.positions(positions)
        for layer, kv in zip(self.layers, pool, strict=True):
            x = layer(x, slots, chunks, kv)
        last = torch.tensor([c.start + c.length - 1 for c in chunks])
        logits: torch.Tensor = self.head(self.norm(x[last]))
        return logits
