"""The pure CONCUR controller: its window law, table-driven, and its admission queue."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig


def healthy(queries: float, hits: float, usage: float = 0.5, **more: float) -> CacheSample:
    return CacheSample(usage=usage, prefix_queries=queries, prefix_hits=hits, preemptions=more.get("pre", 0.0),
                       recomputed_tokens=more.get("rec", 0.0), evictions=more.get("ev", 0.0))


def vllm(queries: float, hits: float, usage: float = 0.5, pre: float = 0.0) -> CacheSample:
    """What vLLM exports: usage, prefix-cache counters and preemptions; no recompute count."""
    return CacheSample(usage=usage, prefix_queries=queries, prefix_hits=hits, preemptions=pre)


@dataclass
class Case:
    name: str
    samples: list[CacheSample | None]
    windows: list[int]  # after each observe
    actions: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    interval: float = 1.0


CASES = [
    Case("slow start doubles while agents are held",
         [healthy(0, 0), healthy(100, 80), healthy(200, 160)], [8, 16, 32], ["increase"] * 3),
    Case("an eviction ends the doubling without shrinking",
         [healthy(0, 0), healthy(100, 80, ev=3), healthy(200, 160, ev=3)], [8, 9, 10], ["increase"] * 3),
    Case("recomputed prefixes shrink the window, then it grows by one",
         [healthy(0, 0), healthy(100, 80, rec=30), healthy(200, 160, rec=30), healthy(300, 240, rec=30)],
         [8, 5, 6, 7], ["increase", "decrease", "increase", "increase"]),
    Case("recompute under the tolerance is no congestion",
         [healthy(0, 0), healthy(1000, 800, rec=40)], [8, 16], ["increase", "increase"]),
    Case("a severe recompute cuts deeper, down to the severity floor",
         [healthy(0, 0), healthy(100, 20, rec=80), healthy(200, 40, rec=82)], [8, 2, 3],
         ["increase", "decrease", "increase"], {"severity_floor": 0.25}),
    Case("a preemption shrinks the window",
         [healthy(0, 0), healthy(100, 80, pre=1)], [8, 5], ["increase", "decrease"]),
    Case("high usage and a falling hit rate shrink it; high usage alone holds",
         [healthy(0, 0, 0.95), healthy(100, 90, 0.95), healthy(200, 180, 0.95), healthy(300, 200, 0.95)],
         [4, 4, 4, 2], ["hold", "hold", "hold", "decrease"]),
    Case("a falling hit rate at low usage is no congestion",
         [healthy(0, 0), healthy(100, 90), healthy(200, 110)], [8, 16, 32], ["increase"] * 3),
    Case("one decrease per cooldown: the next signal within it holds",
         [healthy(0, 0, rec=0), healthy(100, 0, rec=50), healthy(200, 0, rec=100), healthy(300, 0, rec=150)],
         [8, 5, 5, 3], ["increase", "decrease", "hold", "decrease"], {"cooldown_s": 1.5}),
    Case("the window never falls below w_min",
         [healthy(0, 0, pre=0), healthy(10, 0, pre=1), healthy(20, 0, pre=2), healthy(30, 0, pre=3)],
         [8, 5, 3, 2], ["increase", "decrease", "decrease", "decrease"], {"w_min": 2}),
    Case("the window never exceeds w_max", [healthy(0, 0), healthy(10, 9), healthy(20, 18)], [8, 10, 10],
         ["increase"] * 3, {"w_max": 10}),
    Case("no answer holds the window where it is and says so",
         [healthy(0, 0), None, None, healthy(100, 80)], [8, 8, 8, 16], ["increase", "no_signal", "no_signal", "increase"]),
    Case("a counter reset is read as no evidence, not as congestion",
         [healthy(0, 0), healthy(500, 400, rec=5), healthy(10, 8, rec=0)], [8, 16, 32], ["increase"] * 3),
    Case("vLLM: a falling hit rate shrinks the window at any usage, as deep as the fall",
         [vllm(0, 0), vllm(100, 80), vllm(200, 160), vllm(300, 180)], [8, 16, 32, 22],
         ["increase", "increase", "increase", "decrease"]),
    Case("vLLM: a steep fall cuts down to the severity floor",
         [vllm(0, 0), vllm(100, 90), vllm(200, 100)], [8, 16, 4], ["increase", "increase", "decrease"],
         {"severity_floor": 0.25}),
    Case("vLLM: a small wobble of the hit rate is no congestion",
         [vllm(0, 0), vllm(100, 80), vllm(200, 155)], [8, 16, 32], ["increase"] * 3),
    Case("vLLM: a preemption shrinks the window",
         [vllm(0, 0), vllm(100, 80, pre=2)], [8, 5], ["increase", "decrease"]),
    Case("SGLang's gauges: the hit rate as given",
         [CacheSample(usage=0.95, hit_rate=0.8), CacheSample(usage=0.95, hit_rate=0.8),
          CacheSample(usage=0.95, hit_rate=0.5)], [4, 4, 2], ["hold", "hold", "decrease"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_window_law(case: Case) -> None:
    ctl = AdmissionController(ControllerConfig(w_max=case.config.pop("w_max", 64), w_init=4, **case.config))
    for i in range(80):  # many agents want to run: the window is binding throughout
        ctl.request(f"a{i}")
    windows, actions = [], []
    for step, sample in enumerate(case.samples):
        d = ctl.observe(sample, now=step * case.interval)
        windows.append(d.window)
        actions.append(d.action)
        assert d.window == ctl.window
        # held agents fill every slot the window opens; a shrink interrupts nobody
        assert len(ctl.active) == max(windows)
    assert (windows, actions) == (case.windows, case.actions)


def test_no_signal_reason_names_the_endpoint_and_admits_nobody_beyond_the_window() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=3, slow_start=False))
    assert [ctl.request(f"a{i}") for i in range(5)] == [True, True, True, False, False]
    d1 = ctl.observe(None, now=10.0)
    d2 = ctl.observe(None, now=12.5)
    assert d2.action == "no_signal" and "not answering for 2.5s" in d2.reason and "held at 3" in d2.reason
    assert d1.admitted == d2.admitted == () and ctl.window == 3 and len(ctl.active) == 3
    assert ctl.release("a0") == ("a3",)  # within the window a finished agent's slot is passed on
    assert len(ctl.active) == 3 and ctl.held == ("a4",)


def test_not_binding_holds() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=4))
    ctl.request("a")
    ctl.observe(healthy(0, 0), 0.0)
    d = ctl.observe(healthy(100, 90), 1.0)
    assert (d.action, d.window) == ("hold", 4) and "not binding" in d.reason


def test_held_agents_are_admitted_in_order_and_only_between_steps() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=2, slow_start=False, decrease_factor=0.5))
    assert [ctl.request(a) for a in "abcd"] == [True, True, False, False]
    assert ctl.request("c") is False and ctl.held == ("c", "d")  # asking again keeps its place
    ctl.observe(healthy(0, 0, usage=0.95), 0.0)  # near saturation: holds
    d = ctl.observe(healthy(100, 0, usage=0.95, pre=1), 1.0)  # shrink to 1 while a and b run
    assert d.window == 1 and ctl.active == ("a", "b")  # nobody is interrupted mid-generation
    assert ctl.request("b") is False  # b, at its next step boundary, gives its slot up
    assert ctl.active == ("a",) and ctl.held == ("c", "d", "b")
    assert ctl.request("a") is True  # a fits the window: it goes on
    assert ctl.release("a") == ("c",)
    assert ctl.release("c") == ("d",)
    assert ctl.release("d") == ("b",)


def test_state_round_trip_keeps_window_queue_and_averages() -> None:
    cfg = ControllerConfig(w_init=2, slow_start=False)
    ctl = AdmissionController(cfg)
    for a in "abcde":
        ctl.request(a)
    ctl.observe(healthy(0, 0), 0.0)
    ctl.observe(healthy(100, 70), 1.0)
    again = AdmissionController(cfg, state=ctl.state())
    assert (again.window, again.active, again.held) == (ctl.window, ctl.active, ctl.held)
    assert again.observe(healthy(200, 140), 2.0) == ctl.observe(healthy(200, 140), 2.0)


@pytest.mark.parametrize(("kwargs", "field_name"), [
    ({"w_min": 0}, "w_min"), ({"w_max": 0, "w_min": 1, "w_init": 1}, "w_max"), ({"w_init": 99, "w_max": 8}, "w_init"),
    ({"decrease_factor": 1.0}, "decrease_factor"), ({"usage_high": 1.5}, "usage_high"),
    ({"ewma_alpha": 0.0}, "ewma_alpha"), ({"severity_floor": 0.0}, "severity_floor"), ({"cooldown_s": -1.0}, "cooldown_s"), ({"additive_step": 0}, "additive_step"),
])
def test_bad_config_is_refused_naming_the_field(kwargs: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field_name}: "):
        ControllerConfig(**kwargs)


def test_a_restored_window_outside_the_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="^window: "):
        AdmissionController(ControllerConfig(w_max=8), state={"window": 20})


def test_recompute_of_agents_it_paused_is_not_read_as_congestion() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=2, slow_start=False, decrease_factor=0.5, cooldown_s=1.0))
    for a in "abc":
        ctl.request(a)
    ctl.observe(healthy(0, 0, usage=0.95), 0.0)
    assert ctl.observe(healthy(100, 0, usage=0.95, pre=1), 1.0).window == 1
    assert ctl.request("b") is False  # paused at its step boundary
    assert ctl.release("a") == ("c",)  # c was held first
    assert ctl.release("c") == ("b",)  # b comes back: it lost its cache while held
    d = ctl.observe(healthy(200, 0, usage=0.95, pre=2, rec=80), 3.0)  # its recompute, and a preemption
    assert (d.action, d.window) == ("decrease", 1)  # a preemption is still congestion
    ctl2 = AdmissionController(ControllerConfig(w_init=2, slow_start=False, decrease_factor=0.5, cooldown_s=1.0))
    for a in "abc":
        ctl2.request(a)
    ctl2.observe(healthy(0, 0, usage=0.95), 0.0)
    ctl2.observe(healthy(100, 0, usage=0.95, pre=1), 1.0)
    ctl2.request("b")
    ctl2.release("a")
    ctl2.release("c")
    d = ctl2.observe(healthy(200, 100, usage=0.5, pre=1, rec=80), 3.0)  # the resume is seen here
    d = ctl2.observe(healthy(300, 150, usage=0.5, pre=1, rec=160), 3.5)
    assert (d.action, d.window) == ("hold", 1) and "resumed after a pause" in d.reason
    d = ctl2.observe(healthy(400, 200, usage=0.5, pre=1, rec=240), 5.0)  # past the cooldown: congestion again
    assert d.action == "decrease"


def test_without_pause_on_shrink_active_agents_keep_their_slots() -> None:
    ctl = AdmissionController(ControllerConfig(w_init=2, slow_start=False, pause_on_shrink=False, decrease_factor=0.5))
    for a in "abc":
        ctl.request(a)
    ctl.observe(healthy(0, 0, usage=0.95), 0.0)
    ctl.observe(healthy(100, 0, usage=0.95, pre=1), 1.0)
    assert ctl.window == 1 and ctl.request("b") is True and ctl.active == ("a", "b")
    assert ctl.release("a") == ()  # two active, window 1: c waits
    assert ctl.release("b") == ("c",)
