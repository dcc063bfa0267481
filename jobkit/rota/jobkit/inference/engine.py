"""Continuous batching over the paged KV cache, with prefix caching and recompute.

Each ``step`` schedules, under a per-step token budget, first the running sequences (a
decode token each, or the next chunk of an unfinished prefill), then waiting requests in
arrival order: a new request first takes the longest resident prefix of its prompt from
the cache (a prefix hit) and prefills the rest in chunks. When a running sequence needs a
block and every block is referenced, the latest-admitted running sequence is preempted
(vLLM's recompute mode): its blocks are released, it goes back to the head of the queue,
and it is prefilled again when readmitted. Tokens of a prompt whose blocks had been
computed before and were evicted (or lay behind an evicted block in the chain) are
prefilled again: a real prefill through the model, counted as *recomputed*.

Greedy decoding (argmax) keeps runs deterministic for a given seed and schedule.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from rota.jobkit.inference.kvcache import BLOCK_SIZE, BlockPool, chain_hashes
from rota.jobkit.inference.model import ModelConfig, SeqChunk, TinyDecoder

__all__ = ["Engine", "EngineConfig", "EngineCounters", "Finished"]

_OFFSETS = torch.arange(BLOCK_SIZE)


@dataclass(frozen=True)
class EngineConfig:
    cache_blocks: int = 512
    token_budget: int = 512
    max_running: int = 256
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        if self.cache_blocks < 2:
            raise ValueError(f"cache_blocks: must be at least 2, got {self.cache_blocks}")
        if self.token_budget < 1:
            raise ValueError(f"token_budget: must be at least 1, got {self.token_budget}")
        if self.max_running < 1:
            raise ValueError(f"max_running: must be at least 1, got {self.max_running}")


@dataclass
class EngineCounters:
    """Cumulative counters, as the /metrics page exports them (tokens unless named)."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    generated: int = 0
    prefilled: int = 0
    recomputed: int = 0
    evictions: int = 0  # blocks
    steps: int = 0
    usage: float = 0.0
    running: int = 0
    waiting: int = 0
    cache_blocks: int = 0  # the cache's size: not a counter, exported as vLLM's cache_config_info
    block_tokens: int = 0


@dataclass(frozen=True)
class Finished:
    request_id: str
    tokens: list[int]  # the generated tokens
    cached_tokens: int  # prompt tokens served from the cache at the last admission
    last_logits: torch.Tensor  # the logits the last token was sampled from


@dataclass
class _Seq:
    request_id: str
    tokens: list[int]
    max_new: int
    generated: int = 0
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # of the committed (full, computed) blocks
    cached_tokens: int = 0


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model = TinyDecoder(config.model)
        self.pool = BlockPool(config.cache_blocks)
        self.kv = self.model.new_pool(config.cache_blocks * BLOCK_SIZE)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._seen: set[int] = set()  # every block hash ever computed
        self.counters = EngineCounters(cache_blocks=config.cache_blocks, block_tokens=BLOCK_SIZE)
        self._lock = threading.Lock()
        self._published = EngineCounters(cache_blocks=config.cache_blocks, block_tokens=BLOCK_SIZE)
        #: What the last step computed, for a step-cost model: (tokens, decodes, context
        #: positions the decodes read, query x context pairs of the prefill chunks, chunks).
        self.last_work: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    # -- requests ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise ValueError("prompt: must hold at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be at least 1, got {max_new_tokens}")
        vocab = self.config.model.vocab
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt: tokens must lie in [0, {vocab})")
        needed = -(-(len(prompt) + max_new_tokens) // BLOCK_SIZE)
        if needed > self.config.cache_blocks:
            raise ValueError(f"cache_blocks: a request of {len(prompt) + max_new_tokens} tokens needs {needed} "
                             f"blocks, the cache has {self.config.cache_blocks}")
        self._waiting.append(_Seq(request_id, list(prompt), max_new_tokens))
        self._publish()

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def snapshot(self) -> EngineCounters:
        """The counters as of the last step; safe to call from another thread."""
        with self._lock:
            return EngineCounters(**vars(self._published))

    # -- one step ----------------------------------------------------------------------
    def step(self) -> list[Finished]:
        scheduled = self._schedule()
        finished: list[Finished] = []
        self.last_work = (0, 0, 0, 0, 0)
        if scheduled:
            logits = self._forward(scheduled)
            for (seq, n), row in zip(scheduled, logits, strict=True):
                seq.computed += n
                self._commit(seq)
                if seq.computed == len(seq.tokens):
                    seq.tokens.append(int(row.argmax()))
                    seq.generated += 1
                    self.counters.generated += 1
                    if seq.generated == seq.max_new:
                        finished.append(self._finish(seq, row))
            self.counters.steps += 1
        self._publish()
        return finished

    def _schedule(self) -> list[tuple[_Seq, int]]:
        budget = self.config.token_budget
        scheduled: list[tuple[_Seq, int]] = []
        i = 0
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            n = min(len(seq.tokens) - seq.computed, budget)
            if not self._grow(seq, seq.computed + n):
                # preempt from the back until this one fits (or it was the last itself)
                while not self._grow(seq, seq.computed + n) and self._running[-1] is not seq:
                    self._preempt(self._running[-1])
                if not self._grow(seq, seq.computed + n):
                    self._preempt(seq)
                    continue
            scheduled.append((seq, n))
            budget -= n
            i += 1
        while self._waiting and budget > 0 and len(self._running) < self.config.max_running:
            seq = self._waiting[0]
            n = self._admit(seq, budget)
            if n == 0:
                break
            self._waiting.popleft()
            self._running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def _admit(self, seq: _Seq, budget: int) -> int:
        """Take the cached prefix and the blocks of the first chunk; 0 when they do not fit."""
        hashes = chain_hashes(seq.tokens)
        usable = hashes[:(len(seq.tokens) - 1) // BLOCK_SIZE]  # at least one token is computed
        hit = self.pool.match(usable)
        computed = len(hit) * BLOCK_SIZE
        n = min(len(seq.tokens) - computed, budget)
        need = -(-(computed + n) // BLOCK_SIZE) - len(hit)
        if need > self.pool.free_after_taking(hit):
            return 0
        self.pool.take(hit)
        seq.blocks, seq.hashes, seq.computed = list(hit), hashes[:len(hit)], computed
        for _ in range(need):
            block = self.pool.allocate()
            assert block is not None
            seq.blocks.append(block)
        seq.cached_tokens = computed
        self.counters.prefix_queries += len(seq.tokens)
        self.counters.prefix_hits += computed
        self.counters.recomputed += BLOCK_SIZE * sum(1 for h in hashes[len(hit):] if h in self._seen)
        return n

    def _grow(self, seq: _Seq, tokens: int) -> bool:
        while len(seq.blocks) * BLOCK_SIZE < tokens:
            block = self.pool.allocate()
            if block is None:
                return False
            seq.blocks.append(block)
        return True

    def _preempt(self, seq: _Seq) -> None:
        self._running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.hashes, seq.computed = [], [], 0
        self._waiting.appendleft(seq)
        self.counters.preemptions += 1

    def _commit(self, seq: _Seq) -> None:
        full = seq.computed // BLOCK_SIZE
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else None
            h = chain_hashes(seq.tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE], parent)[0]
            self.pool.commit(seq.blocks[i], h)
            seq.hashes.append(h)
            self._seen.add(h)

    def _finish(self, seq: _Seq, logits: torch.Tensor) -> Finished:
        self._running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        return Finished(seq.request_id, seq.tokens[-seq.generated:], seq.cached_tokens, logits)

    def _forward(self, scheduled: list[tuple[_Seq, int]]) -> torch.Tensor:
        decodes = [seq.computed + 1 for seq, n in scheduled if n == 1]
        pairs = sum(n * (seq.computed + n) for seq, n in scheduled if n > 1)
        self.last_work = (sum(n for _, n in scheduled), len(decodes), sum(decodes), pairs, len(scheduled))
        tokens: list[int] = []
        positions: list[int] = []
        chunks: list[SeqChunk] = []
        new_slots: list[torch.Tensor] = []
        for seq, n in scheduled:
            start = seq.computed
            slots = (torch.tensor(seq.blocks).unsqueeze(1) * BLOCK_SIZE + _OFFSETS).flatten()[:start + n]
            chunks.append(SeqChunk(len(tokens), n, slots))
            tokens += seq.tokens[start:start + n]
            positions += range(start, start + n)
            new_slots.append(slots[start:])
            self.counters.prefilled += n if n > 1 or seq.computed + n < len(seq.tokens) else 0
        return self.model(torch.tensor(tokens), torch.tensor(positions), torch.cat(new_slots), chunks, self.kv)

    def _publish(self) -> None:
        c = self.counters
        c.evictions = self.pool.evictions
        c.usage = self.pool.usage()
        c.running, c.waiting = len(self._running), len(self._waiting)
        with self._lock:
            self._published = EngineCounters(**vars(c))
