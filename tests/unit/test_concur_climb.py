"""The goodput hill-climb over the admission window (`rota.jobkit.inference.kv_climb`), table-driven."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb
from rota.jobkit.inference.kv_window import CacheSample, ControllerConfig


@dataclass
class Engine:
    """Cumulative counters of a fake engine: each interval adds its tokens and events."""

    generated: float = 0.0
    queries: float = 0.0
    hits: float = 0.0
    preemptions: float = 0.0
    recomputed: float | None = 0.0

    def interval(self, tokens: float, pre: float = 0.0, rec: float = 0.0, queries: float = 100.0) -> CacheSample:
        self.generated += tokens
        self.queries += queries
        self.hits += queries / 2
        self.preemptions += pre
        if self.recomputed is not None:
            self.recomputed += rec
        return CacheSample(usage=0.5, prefix_queries=self.queries, prefix_hits=self.hits,
                           preemptions=self.preemptions, recomputed_tokens=self.recomputed, generated=self.generated)


@dataclass
class Case:
    name: str
    intervals: list[dict[str, float]]  # tokens per interval (1 s each), and events
    windows: list[int]  # after each observe (the first observe only sets the counters' base)
    climb: dict[str, Any] = field(default_factory=dict)
    w_init: int = 8
    vllm: bool = False  # no recompute counter


def epochs(*tokens: float) -> list[dict[str, float]]:
    """One epoch of two intervals per figure (tokens per interval)."""
    return [{"tokens": t} for t in tokens for _ in range(2)]


START = [{"tokens": 0.0}, {"tokens": 100.0}]  # the counters' base, then the first interval

CASES = [
    Case("slow start doubles while goodput rises (the first doubling after one interval)",
         [*START, *epochs(150, 220)], [8, 16, 16, 32, 32, 64]),
    Case("goodput falling after a doubling goes back", [*START, *epochs(150, 120)],
         [8, 16, 16, 32, 32, 16]),
    Case("a re-measure where it went back that holds probes up by half the step",
         [*START, *epochs(150, 120, 150)], [8, 16, 16, 32, 32, 16, 16, 24]),
    Case("a re-measure where it went back that fell probes down",
         [*START, *epochs(150, 120, 110)], [8, 16, 16, 32, 32, 16, 16, 8]),
    Case("no worse is on: the climb goes on through a plateau", [*START, *epochs(150, 148)],
         [8, 16, 16, 32, 32, 64]),
    Case("after a back-off the climb probes up by one per epoch while goodput holds",
         [{"tokens": 0}, {"tokens": 100, "pre": 1}, *epochs(100, 100, 80)], [8, 5, 5, 6, 6, 7, 7, 6]),
    Case("a preemption cuts at once, whatever the goodput",
         [{"tokens": 0}, {"tokens": 100}, {"tokens": 100, "pre": 1}], [8, 16, 11]),
    Case("recompute of live prefixes cuts at once (where the engine counts it)",
         [{"tokens": 0}, {"tokens": 100, "rec": 30}], [8, 5]),
    Case("recompute within the tolerance is no congestion", [{"tokens": 0}, {"tokens": 100, "rec": 3}], [8, 16]),
    Case("a deeper back-off factor cuts deeper", [{"tokens": 0}, {"tokens": 100, "pre": 1}], [8, 4],
         {"backoff": 0.5}),
    Case("an epoch of one interval moves every interval", [{"tokens": 0}, {"tokens": 40}, {"tokens": 80}],
         [8, 16, 32], {"epoch_intervals": 1}),
    Case("the window never exceeds w_max (the agents)", [*START, *epochs(200, 400)],
         [8, 16, 16, 20, 20, 20], w_init=8),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_climb_law(case: Case) -> None:
    ctl = GoodputClimb(ControllerConfig(w_min=1, w_max=20 if "w_max" in case.name else 1024, w_init=case.w_init,
                                        cooldown_s=0.5), ClimbConfig(**case.climb))
    for i in range(100):  # agents waiting: the window binds
        ctl.request(f"a{i:03d}")
    engine = Engine(recomputed=None if case.vllm else 0.0)
    got = []
    for t, step in enumerate(case.intervals):
        decision = ctl.observe(engine.interval(step["tokens"], step.get("pre", 0.0), step.get("rec", 0.0)), float(t))
        got.append(decision.window)
    assert got == case.windows


def test_a_window_that_does_not_bind_is_not_measured() -> None:
    ctl = GoodputClimb(ControllerConfig(w_init=8), ClimbConfig(epoch_intervals=1))
    for i in range(3):  # fewer agents than the window: nothing to learn from goodput
        assert ctl.request(f"a{i}")
    engine = Engine()
    windows = [ctl.observe(engine.interval(t), float(i)).window for i, t in enumerate((0, 50, 100, 10))]
    assert windows == [8, 8, 8, 8]


def test_no_sample_holds_the_window() -> None:
    ctl = GoodputClimb(ControllerConfig(w_init=4))
    decision = ctl.observe(None, 1.0)
    assert (decision.window, decision.action) == (4, "no_signal")


def test_paused_agents_resume_before_agents_that_never_ran() -> None:
    ctl = GoodputClimb(ControllerConfig(w_init=3, cooldown_s=0.0), ClimbConfig(backoff=0.5))
    assert ctl.request("a") and ctl.request("b") and ctl.request("c")
    assert not ctl.request("d")  # never ran: held
    engine = Engine()
    ctl.observe(engine.interval(10), 0.0)
    assert ctl.observe(engine.interval(10, pre=1), 1.0).window == 1
    assert not ctl.request("a")  # at its step boundary it gives its slot up
    assert not ctl.request("b")  # paused after a: resumed after a, before d
    assert ctl.held == ("a", "b", "d")
    assert ctl.release("c") == ("a",)


def test_recompute_of_agents_resumed_after_a_pause_is_not_congestion() -> None:
    ctl = GoodputClimb(ControllerConfig(w_init=4, cooldown_s=0.5), ClimbConfig(backoff=0.5))
    assert all(ctl.request(a) for a in "abcd") and not ctl.request("e")
    engine = Engine()
    ctl.observe(engine.interval(10), 0.0)
    assert ctl.observe(engine.interval(10, pre=1), 1.0).window == 2
    assert not ctl.request("a") and ctl.held == ("a", "e")
    assert ctl.release("c") == () and ctl.release("d") == ("a",)
    held = ctl.observe(engine.interval(10, rec=50), 3.0)  # a lost its history while it waited
    assert (held.window, held.action) == (2, "hold")
    assert ctl.request("a")  # its turn back is done
    assert ctl.observe(engine.interval(10, rec=50), 4.0).window == 1  # recompute now is congestion


def sample_at(engine: Engine, tokens: float, running: float, usage: float, **events: float) -> CacheSample:
    """An interval of the fake engine, with ``running`` requests holding ``usage`` of the cache."""
    base = engine.interval(tokens, events.get("pre", 0.0), events.get("rec", 0.0))
    return CacheSample(usage=usage, prefix_queries=base.prefix_queries, prefix_hits=base.prefix_hits,
                       preemptions=base.preemptions, recomputed_tokens=base.recomputed_tokens,
                       generated=base.generated, running=running)


def fitting(w_init: int = 24, **climb: Any) -> GoodputClimb:
    ctl = GoodputClimb(ControllerConfig(w_init=w_init, w_max=w_init, cooldown_s=0.5),
                       ClimbConfig(**({"fit_headroom": 0.5, "fit_samples": 2} | climb)))
    for i in range(40):
        ctl.request(f"a{i:02d}")
    return ctl


def test_fit_is_running_requests_per_unit_of_usage_over_the_last_samples() -> None:
    ctl, engine = fitting(), Engine()
    assert ctl.fit() is None  # no scrape yet
    ctl.observe(sample_at(engine, 0, running=10, usage=0.5), 0.0)
    assert ctl.fit() == pytest.approx(20.0)
    ctl.observe(sample_at(engine, 50, running=0, usage=0.0), 1.0)  # nothing running: says nothing
    ctl.observe(sample_at(engine, 50, running=6, usage=0.5), 2.0)
    assert ctl.fit() == pytest.approx(16.0)  # (10 + 6) / (0.5 + 0.5)
    ctl.observe(sample_at(engine, 50, running=4, usage=0.5), 3.0)
    assert ctl.fit() == pytest.approx(10.0)  # the first sample has left the window of 2


def test_a_cut_goes_straight_to_what_fits_when_that_is_deeper() -> None:
    ctl, engine = fitting(), Engine()
    ctl.observe(sample_at(engine, 0, running=12, usage=1.0), 0.0)
    cut = ctl.observe(sample_at(engine, 100, running=12, usage=1.0, pre=1), 1.0)
    assert (cut.window, cut.action) == (6, "decrease")  # 0.5 x 12 fit, not 0.7 x 24 = 16


def test_without_headroom_a_cut_is_multiplicative_only() -> None:
    ctl, engine = fitting(fit_headroom=0.0), Engine()
    ctl.observe(sample_at(engine, 0, running=12, usage=1.0), 0.0)
    assert ctl.observe(sample_at(engine, 100, running=12, usage=1.0, pre=1), 1.0).window == 16


def test_what_fits_binds_only_after_congestion_was_seen() -> None:
    ctl, engine = fitting(w_init=8), Engine()
    windows = [ctl.observe(sample_at(engine, t, running=4, usage=1.0), float(i)).window
               for i, t in enumerate((0, 100, 100))]
    assert windows == [8, 8, 8]  # 2 agents fit, but nothing was evicted: the whole batch keeps its slots


def test_after_congestion_the_window_shrinks_as_histories_grow_and_probes_stop_at_the_fit() -> None:
    ctl, engine = fitting(fit_headroom=1.0, fit_samples=1), Engine()
    ctl.observe(sample_at(engine, 0, running=20, usage=1.0), 0.0)
    assert ctl.observe(sample_at(engine, 100, running=20, usage=1.0, rec=50), 1.0).window == 16  # 0.7 x 24
    shrink = ctl.observe(sample_at(engine, 100, running=10, usage=1.0), 2.0)  # contexts doubled: 10 fit
    assert (shrink.window, shrink.action) == (10, "decrease")
    assert ctl.observe(sample_at(engine, 20, running=5, usage=0.55), 2.2).window == 9  # no cool-down: occupancy
    ctl.observe(sample_at(engine, 80, running=5, usage=0.5), 3.0)
    decisions = [ctl.observe(sample_at(engine, t, running=5, usage=0.5), 4.0 + i)
                 for i, t in enumerate((100, 100, 150, 150, 200, 200))]
    assert [d.window for d in decisions] == [10] * 6  # goodput rises, but 10 agents is what fits
    assert any("probe up" in d.reason for d in decisions)


def test_after_congestion_a_probe_down_stops_at_what_fits() -> None:
    ctl, engine = fitting(fit_headroom=1.0, fit_samples=1), Engine()
    ctl.observe(sample_at(engine, 0, running=20, usage=1.0), 0.0)
    assert ctl.observe(sample_at(engine, 100, running=20, usage=1.0, pre=1), 1.0).window == 16
    assert ctl.observe(sample_at(engine, 100, running=8, usage=1.0), 2.0).window == 8  # 8 fit
    decisions = [ctl.observe(sample_at(engine, t, running=8, usage=1.0), 3.0 + i)
                 for i, t in enumerate((100, 100, 80, 80, 60, 60, 40, 40))]  # the batch drains
    assert any("probe down" in d.reason for d in decisions)
    assert [d.window for d in decisions] == [8] * 8  # fewer agents than fit cannot relieve the cache


@pytest.mark.parametrize(("field_name", "value"), [("epoch_intervals", 0), ("tolerance", 1.0), ("backoff", 1.0),
                                                   ("backoff", 0.0), ("max_step_fraction", 0.0),
                                                   ("fit_headroom", -0.1), ("fit_samples", 0)])
def test_bad_climb_config_is_refused_naming_the_field(field_name: str, value: float) -> None:
    change: dict[str, Any] = {field_name: value}
    with pytest.raises(ValueError, match=field_name):
        ClimbConfig(**change)


def test_the_scrape_reads_goodput_from_the_generation_counter() -> None:
    from rota.jobkit.inference.scrape import parse_text, sample_from

    page = ('vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            'vllm:generation_tokens_total{engine="0"} 120\nvllm:generation_tokens_total{engine="1"} 30\n')
    sample = sample_from(parse_text(page))
    assert sample is not None and (sample.usage, sample.generated) == (0.25, 150.0)
    assert sample_from(parse_text('vllm:kv_cache_usage_perc 0.5\n')).generated is None  # type: ignore[union-attr]


def test_the_scrape_reads_running_requests() -> None:
    from rota.jobkit.inference.scrape import parse_text, sample_from

    sample = sample_from(parse_text('vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running{engine="0"} 7\n'))
    assert sample is not None and sample.running == 7.0
    assert sample_from(parse_text('vllm:kv_cache_usage_perc 0.5\n')).running is None  # type: ignore[union-attr]
