"""Once the cache binds, the climb counts an active agent at least at what finished agents'
last turns held on average (``ClimbConfig.size_from_finished``): histories grow, and a window
that fits today's turns is outgrown by the next ones."""

from __future__ import annotations

import pytest

from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb
from rota.jobkit.inference.kv_window import CacheSample, ControllerConfig

TURN = 808  # 26 blocks of 32
FINAL = 2000  # 63 blocks: three agents counted at it (189) do not fit in 128, two (126) do


def climb(size_from_finished: bool) -> GoodputClimb:
    """Agents a, b, c admitted at a turn of TURN tokens; a grew to FINAL and finished."""
    ctl = GoodputClimb(ControllerConfig(w_init=16, w_max=16), ClimbConfig(size_from_finished=size_from_finished))
    ctl.observe(CacheSample(usage=0.0, cache_blocks=128, block_tokens=32, preemptions=0.0), 0.0)
    assert all(ctl.request(a, TURN) for a in "abc")
    assert ctl.request("a", FINAL)  # an active agent's turn is never refused for its size
    ctl.release("a")
    return ctl


def congest(ctl: GoodputClimb) -> None:
    decision = ctl.observe(CacheSample(usage=0.9, preemptions=1.0), 1.0)
    assert decision.action == "decrease"


@pytest.mark.parametrize("size_from_finished", [True, False])
def test_before_the_cache_binds_finished_sizes_do_not_count(size_from_finished: bool) -> None:
    ctl = climb(size_from_finished)
    assert ctl.request("d", TURN)  # b, c, d at 26 blocks each: 78 of 128
    assert ctl.request("b", TURN + 32)  # and b goes on at its step boundary


@pytest.mark.parametrize(("size_from_finished", "b_goes_on", "e_admitted"), [
    (True, False, False),  # b, c, d counted at 63 blocks each no longer fit: b gives its slot up
    (False, True, True),  # today's turns (27 + 26 + 26 + 26 blocks) fit: everyone goes on
])
def test_once_the_cache_binds_active_agents_count_at_the_finished_mean(
        size_from_finished: bool, b_goes_on: bool, e_admitted: bool) -> None:
    ctl = climb(size_from_finished)
    assert ctl.request("d", TURN)
    congest(ctl)
    assert ctl.request("b", TURN + 32) is b_goes_on
    assert ctl.request("e", TURN) is e_admitted
    if not b_goes_on:
        assert ctl.active == ("c", "d") and ctl.window == 2 and ctl.held == ("b", "e")


def test_the_paused_agent_comes_back_when_a_counted_turn_leaves() -> None:
    ctl = climb(True)
    assert ctl.request("d", TURN)
    congest(ctl)
    assert not ctl.request("b", TURN + 32)
    assert ctl.release("c") == ("b",)  # d and b, counted at 63 blocks each, fit again
