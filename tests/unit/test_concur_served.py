"""An agent's request served with fewer cached tokens than its previous turn left in the cache
is a live agent's history recomputed (`AdmissionController.served`): the signal vLLM, which
counts no recompute, gives per request (``usage.prompt_tokens_details.cached_tokens``)."""

from __future__ import annotations

import pytest

from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb
from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig

SIZE = CacheSample(usage=0.0, cache_blocks=128, block_tokens=32, prefix_queries=0.0, prefix_hits=0.0)


def vllm(queries: float, **more: float) -> CacheSample:
    """A vLLM scrape: no recompute counter."""
    return CacheSample(usage=0.5, prefix_queries=queries, prefix_hits=0.0, preemptions=0.0, **more)  # type: ignore[arg-type]


def second_turn(ctl: AdmissionController, cached: int) -> None:
    """Agent a's first turn (808 tokens: 25 full blocks, 800 tokens, stay cached), then its
    second, 880 tokens, served with ``cached`` of them from the cache."""
    assert ctl.request("a", 808)
    ctl.served("a", 800, 0)
    assert ctl.request("a", 880)
    ctl.served("a", 872, cached)


@pytest.mark.parametrize(("cached", "recomputed"), [(800, 0.0), (832, 0.0), (320, 480.0), (0, 800.0)])
def test_what_the_previous_turn_left_and_was_not_served_cached_is_recomputed(cached: int, recomputed: float) -> None:
    ctl = AdmissionController(ControllerConfig(w_init=4, recompute_from_served=True))
    ctl.observe(SIZE, 0.0)
    second_turn(ctl, cached)
    assert ctl._with_served(vllm(1000.0)).recomputed_tokens == recomputed


def test_an_engine_that_counts_recompute_is_believed() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=4, recompute_from_served=True))
    ctl.observe(SIZE, 0.0)
    second_turn(ctl, 0)
    assert ctl._with_served(vllm(1000.0, recomputed_tokens=7.0)).recomputed_tokens == 7.0


def test_without_reports_the_sample_is_unchanged() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=4, recompute_from_served=True))
    ctl.observe(SIZE, 0.0)
    assert ctl._with_served(vllm(10.0)).recomputed_tokens is None


def climb() -> GoodputClimb:
    ctl = GoodputClimb(ControllerConfig(w_init=16, w_max=16, recompute_from_served=True), ClimbConfig())
    ctl.observe(SIZE, 0.0)
    return ctl


def test_a_live_agent_s_recompute_backs_off_from_the_active_count() -> None:
    ctl = climb()
    assert [ctl.request(x, 808) for x in "abcde"] == [True, True, True, True, False]
    ctl.served("a", 800, 0)
    ctl.observe(vllm(0.0), 1.0)
    assert ctl.request("a", 880)
    ctl.served("a", 872, 0)  # its 800 cached tokens were evicted while it was live
    decision = ctl.observe(vllm(1000.0), 2.0)
    assert decision.action == "decrease" and "recomputed" in decision.reason
    assert decision.window == 2  # floor(4 active x 0.7), not floor(16 x 0.7): the cache held the rest


def test_a_paused_agent_s_recompute_is_the_price_of_the_cut() -> None:
    ctl = climb()
    assert [ctl.request(x, 808) for x in "abcd"] == [True] * 4
    ctl.served("a", 800, 0)
    ctl._recovering.add("a")  # as if resumed after a pause: its history was evicted while it waited
    assert ctl._excused("a")
    ctl.observe(vllm(0.0), 1.0)
    ctl._s.earlier["a"] = 808
    ctl.served("a", 872, 0)
    assert ctl._s.recomputed == 0


def test_off_by_default_the_engine_s_sample_is_left_as_it_is() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=4))
    ctl.observe(SIZE, 0.0)
    second_turn(ctl, 0)
    assert ctl._with_served(vllm(1000.0)).recomputed_tokens is None
