"""Recompute is a real prefill: after its prefix was evicted (or its request preempted), a
sequence gets the same next-token logits, and so the same greedy tokens, as the run that
kept its cache, and as one prefill of the whole prompt in a fresh engine."""

from __future__ import annotations

import random

import pytest
import torch

from rota.jobkit.inference.engine import Engine, EngineConfig, Finished
from rota.jobkit.inference.model import ModelConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread")  # tests/conftest.py


SMALL = ModelConfig(d_model=64, heads=4, kv_heads=2, ffn=128, layers=2, max_positions=512, seed=5)


def run(engine: Engine, request_id: str, prompt: list[int], new: int) -> Finished:
    engine.add_request(request_id, prompt, new)
    while True:
        for out in engine.step():
            if out.request_id == request_id:
                return out


def two_turns(cache_blocks: int, token_budget: int, evict: bool) -> tuple[Finished, Engine]:
    rng = random.Random(1)
    prompt = [rng.randrange(256) for _ in range(40)]
    observation = [rng.randrange(256) for _ in range(20)]
    engine = Engine(EngineConfig(cache_blocks=cache_blocks, token_budget=token_budget, model=SMALL))
    first = run(engine, "agent/0", prompt, 8)
    if evict:  # an unrelated request that needs every block of the pool
        run(engine, "filler/0", [rng.randrange(256) for _ in range(cache_blocks * 16 - 2)], 1)
    second = run(engine, "agent/1", prompt + first.tokens + observation, 4)
    return second, engine


def test_recompute_after_eviction_gives_the_same_logits() -> None:
    kept, kept_engine = two_turns(cache_blocks=64, token_budget=512, evict=False)
    evicted, evicted_engine = two_turns(cache_blocks=8, token_budget=16, evict=True)  # chunked prefill too
    assert kept.cached_tokens == 32 and kept_engine.counters.recomputed == 0
    assert evicted.cached_tokens == 0 and evicted_engine.counters.recomputed == 32
    assert evicted_engine.counters.evictions >= 2
    assert evicted.tokens == kept.tokens
    torch.testing.assert_close(evicted.last_logits, kept.last_logits, atol=1e-4, rtol=1e-4)


def test_a_fresh_prefill_of_the_whole_prompt_agrees() -> None:
    kept, _ = two_turns(cache_blocks=64, token_budget=512, evict=False)
    rng = random.Random(1)
    prompt = [rng.randrange(256) for _ in range(40)]
    observation = [rng.randrange(256) for _ in range(20)]
    first = run(Engine(EngineConfig(cache_blocks=64, model=SMALL)), "x/0", prompt, 8)
    fresh = run(Engine(EngineConfig(cache_blocks=64, model=SMALL)), "y/1", prompt + first.tokens + observation, 4)
    assert fresh.tokens == kept.tokens
    torch.testing.assert_close(fresh.last_logits, kept.last_logits, atol=1e-4, rtol=1e-4)


def test_preempted_requests_finish_with_the_tokens_they_would_have_had() -> None:
    rng = random.Random(2)
    prompts = [[rng.randrange(256) for _ in range(30)] for _ in range(3)]
    alone = [run(Engine(EngineConfig(cache_blocks=32, model=SMALL)), f"r{i}", p, 40) for i, p in enumerate(prompts)]
    tight = Engine(EngineConfig(cache_blocks=10, model=SMALL))  # three growing sequences cannot all fit
    for i, p in enumerate(prompts):
        tight.add_request(f"r{i}", p, 40)
    done: dict[str, Finished] = {}
    while tight.has_work():
        done.update((f.request_id, f) for f in tight.step())
    assert tight.counters.preemptions > 0
    for i, a in enumerate(alone):
        assert done[f"r{i}"].tokens == a.tokens
        torch.testing.assert_close(done[f"r{i}"].last_logits, a.last_logits, atol=1e-4, rtol=1e-4)
