"""CONCUR admission within the cache: the cache's size from ``vllm:cache_config_info``, and an
agent admitted only where its next turn fits beside the active agents' (``_fits``)."""

from __future__ import annotations

import json

import pytest

from rota.jobkit.inference.engine import EngineCounters
from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb
from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig
from rota.jobkit.inference.metrics_http import render
from rota.jobkit.inference.scrape import cache_size, sample_from_text

# a real line of vLLM 0.32's /metrics (one engine, 128 blocks of 32 tokens)
VLLM_INFO = ('vllm:cache_config_info{_block_size_resolved="True",block_size="32",cache_dtype="auto",'
             'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.25",kv_cache_size_tokens="4096",'
             'num_gpu_blocks="128",num_gpu_blocks_override="128"} 1.0')
SECOND_ENGINE = VLLM_INFO.replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="128"', 'num_gpu_blocks="64"')
USAGE = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25'

# 808 tokens are 26 blocks of 32 (25.25 rounded up): 4 agents hold 104 of 128 blocks, a 5th would need 130
TURN = 808
CACHE = CacheSample(usage=0.0, cache_blocks=128, block_tokens=32)


@pytest.mark.parametrize(("page", "size"), [
    (f"# TYPE vllm:cache_config_info gauge\n{VLLM_INFO}\n{USAGE}\n", (128.0, 32.0)),
    (f"{USAGE}\n", None),  # an engine that does not say its size
    (f"{VLLM_INFO}\n{SECOND_ENGINE}\n", (192.0, 32.0)),  # two engines: their blocks summed
    ('vllm:cache_config_info{block_size="16"} 1.0\n', None),  # no block count: no size
], ids=["vllm-0.32", "absent", "two-engines", "no-blocks-label"])
def test_cache_size_reads_the_blocks_and_block_size_labels(page: str, size: tuple[float, float] | None) -> None:
    assert cache_size(page) == size


def test_a_sample_from_the_page_carries_the_cache_s_size() -> None:
    sample = sample_from_text(f"{VLLM_INFO}\n{USAGE}\n")
    assert sample is not None and sample.usage == 0.25
    assert (sample.cache_blocks, sample.block_tokens) == (128.0, 32.0)
    bare = sample_from_text(f"{USAGE}\n")
    assert bare is not None and (bare.cache_blocks, bare.block_tokens) == (None, None)


def test_our_engine_s_page_round_trips_its_size() -> None:
    sample = sample_from_text(render(EngineCounters(cache_blocks=40, block_tokens=16)))
    assert sample is not None and (sample.cache_blocks, sample.block_tokens) == (40.0, 16.0)
    unsized = sample_from_text(render(EngineCounters()))  # no size known: no gauge
    assert unsized is not None and unsized.cache_blocks is None


def controller(**config: object) -> AdmissionController:
    """A window of 16 that has read a cache of 128 blocks of 32 tokens."""
    ctl = AdmissionController(ControllerConfig(**({"w_init": 16, "w_max": 16} | config)))  # type: ignore[arg-type]
    ctl.observe(CACHE, 0.0)
    return ctl


def test_before_the_cache_s_size_is_known_admission_is_by_window_only() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=16, w_max=16))
    ctl.observe(CacheSample(usage=0.0), 0.0)  # a sample without the size
    assert all(ctl.request(f"a{i}", TURN) for i in range(16))
    assert not ctl.request("a16", TURN)  # the window, not the cache


def test_agents_are_admitted_while_their_turns_fit_in_the_cache() -> None:
    ctl = controller()
    assert [ctl.request(a, TURN) for a in "abcde"] == [True, True, True, True, False]
    assert ctl.held == ("e",) and ctl.window == 16
    assert not ctl.request("e", TURN)  # asks again: still held, in its place
    assert ctl.release("a") == ("e",)  # 3 x 26 + 26 = 104 blocks fit
    assert ctl.active == ("b", "c", "d", "e") and "a" not in ctl.state()["tokens"]


def test_a_turn_that_grew_is_counted_at_its_new_length() -> None:
    ctl = controller()
    assert ctl.request("a", TURN) and ctl.request("b", TURN)
    assert ctl.request("a", 2 * TURN)  # at its next step boundary: still active, now 51 blocks
    assert ctl.request("c", TURN)  # 51 + 26 + 26 = 103
    assert not ctl.request("d", TURN)  # + 26 = 129 > 128


def test_an_agent_that_does_not_say_its_length_is_admitted_by_the_window() -> None:
    ctl = controller()
    assert all(ctl.request(a, TURN) for a in "abcd")
    assert ctl.request("x")  # 104 blocks active: it would not fit with 808 tokens, but says nothing


def test_an_agent_too_large_for_the_cache_is_admitted_when_none_is_active() -> None:
    ctl = controller()
    assert ctl.request("big", 128 * 32 + 1)  # 129 blocks: alone, or it would wait forever
    assert not ctl.request("small", 32)
    assert ctl.release("big") == ("small",)


@pytest.mark.parametrize(("within", "admitted"), [(True, 4), (False, 16)])
def test_admit_within_cache_switches_the_check(within: bool, admitted: int) -> None:
    ctl = controller(admit_within_cache=within)
    answers = [ctl.request(f"a{i:02d}", TURN) for i in range(20)]
    assert answers == [True] * admitted + [False] * (20 - admitted)


def test_the_window_binds_only_when_its_slots_are_full() -> None:
    cache_bound = controller()
    assert [cache_bound.request(a, TURN) for a in "abcde"][-1] is False
    assert not cache_bound.window_binds()  # e waits for room in the cache, not for a slot
    window_bound = controller(w_init=2)
    assert [window_bound.request(a) for a in "abc"] == [True, True, False]
    assert window_bound.window_binds()


def test_the_window_does_not_grow_while_only_the_cache_binds() -> None:
    ctl = controller()
    assert [ctl.request(a, TURN) for a in "abcde"][-1] is False
    decision = ctl.observe(CacheSample(usage=0.8), 1.0)
    assert (decision.action, decision.window) == ("hold", 16) and "window not binding" in decision.reason


def climb(w_init: int) -> GoodputClimb:
    ctl = GoodputClimb(ControllerConfig(w_init=w_init, w_max=64), ClimbConfig(epoch_intervals=1))
    ctl.observe(CacheSample(usage=0.0, cache_blocks=128, block_tokens=32, generated=0.0), 0.0)
    return ctl


def test_the_climb_holds_the_window_while_only_the_cache_binds() -> None:
    ctl = climb(16)
    assert [ctl.request(a, TURN) for a in "abcde"] == [True, True, True, True, False]
    for t in (1, 2, 3):  # goodput flows, but more slots would admit no one
        decision = ctl.observe(CacheSample(usage=0.8, generated=100.0 * t), float(t))
        assert (decision.action, decision.window) == ("hold", 16)
        assert "window not binding" in decision.reason
    assert ctl.held == ("e",)


def test_the_climb_probes_when_the_window_binds() -> None:  # the contrast: the same goodput moves it
    ctl = climb(2)
    assert [ctl.request(a, 32) for a in "abc"] == [True, True, False]
    assert ctl.observe(CacheSample(usage=0.1, generated=100.0), 1.0).window > 2


def test_the_state_keeps_the_agents_lengths_and_the_cache_s_size() -> None:
    ctl = controller()
    assert all(ctl.request(a, TURN) for a in "abcd")
    state = json.loads(json.dumps(ctl.state()))  # as the job saves it
    assert state["tokens"] == dict.fromkeys("abcd", TURN) and state["cache"] == [128.0, 32.0]
    restored = AdmissionController(ControllerConfig(w_init=16, w_max=16), state=state)
    assert not restored.request("e", TURN)  # no new scrape needed: the size and the lengths were kept
    assert restored.release("a") == ("e",)
