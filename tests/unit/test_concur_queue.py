"""A queue the free cache cannot take, as congestion (`rota.jobkit.inference.kv_climb.queue_binds`), table-driven.

vLLM queues a request whose prompt does not fit rather than preempting a running one, and
counts no recompute: before this signal a batch that thrashed vLLM's cache kept every agent
admitted (`test_a_queue_the_cache_cannot_take_shrinks_the_window_to_what_fits` fails there).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rota.jobkit.inference.engine import EngineCounters
from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb, queue_binds
from rota.jobkit.inference.kv_window import CacheSample, ControllerConfig
from rota.jobkit.inference.metrics_http import render
from rota.jobkit.inference.scrape import parse_text, sample_from


@dataclass(frozen=True)
class QueueCase:
    name: str
    usage: float
    running: float | None
    waiting: float | None
    binds: bool


QUEUE_CASES = [
    QueueCase("queued behind a full cache", 0.95, 4, 10, True),
    QueueCase("as vLLM showed it: 12 queued, 4 running at 0.71", 0.71, 4, 12, True),
    QueueCase("three queued need 0.6 of the cache at 0.2 each, 0.4 is free", 0.6, 3, 3, True),
    QueueCase("exactly the free room: it fits", 0.6, 3, 2, False),
    QueueCase("the queue fits in the free room: a wait for the step's budget, not the cache", 0.6, 3, 1, False),
    QueueCase("many running, small contexts: room for the queue", 0.5, 16, 4, False),
    QueueCase("nothing queued", 0.99, 4, 0, False),
    QueueCase("nothing running: no context to compare the room with", 0.99, 0, 3, False),
    QueueCase("an engine that exports no queue", 0.99, 4, None, False),
    QueueCase("an engine that exports no running count", 0.99, None, 3, False),
]


@pytest.mark.parametrize("case", QUEUE_CASES, ids=[c.name for c in QUEUE_CASES])
def test_queue_binds(case: QueueCase) -> None:
    assert queue_binds(CacheSample(usage=case.usage, running=case.running, waiting=case.waiting)) is case.binds


@dataclass
class VllmLike:
    """Cumulative counters of an engine that queues rather than preempting and counts no recompute."""

    generated: float = 0.0
    queries: float = 0.0
    hits: float = 0.0

    def scrape(self, tokens: float, usage: float, running: float, waiting: float, hit: float = 0.04) -> CacheSample:
        self.generated += tokens
        self.queries += 800.0
        self.hits += 800.0 * hit
        return CacheSample(usage=usage, prefix_queries=self.queries, prefix_hits=self.hits, preemptions=0.0,
                           generated=self.generated, running=running, waiting=waiting)


def sixteen_agents(**climb: float) -> GoodputClimb:
    ctl = GoodputClimb(ControllerConfig(w_min=1, w_max=16, w_init=16, cooldown_s=0.3),
                       ClimbConfig(**({"fit_headroom": 0.7, "fit_samples": 2, "tolerance": 0.1} | climb)))
    for i in range(16):
        assert ctl.request(f"a{i:02d}")  # every agent admitted: the window does not bind
    return ctl


# (usage, running, waiting) per scrape, 0.25 s apart, as vLLM showed them on v16_longprefix
THRASH = [(0.2, 1, 0), (0.71, 4, 12), (0.62, 3, 11), (0.42, 2, 10), (0.62, 3, 8)]


def test_a_queue_the_cache_cannot_take_shrinks_the_window_to_what_fits() -> None:
    ctl, engine = sixteen_agents(), VllmLike()
    decisions = [ctl.observe(engine.scrape(8, u, r, q), 0.25 * i) for i, (u, r, q) in enumerate(THRASH)]
    assert decisions[0].window == 16  # one request running, none queued: the batch keeps its slots
    cut = decisions[1]
    assert cut.action == "decrease" and "queued" in cut.reason
    # straight to 0.7 x the fit over the last two scrapes: (1 + 4) / (0.2 + 0.71) = 5.5 agents fit
    assert cut.window == 3


def test_the_queue_left_from_before_a_cut_does_not_cut_below_what_fits() -> None:
    ctl, engine = sixteen_agents(), VllmLike()
    windows = [ctl.observe(engine.scrape(8, u, r, q), 0.25 * i).window for i, (u, r, q) in enumerate(THRASH)]
    assert windows == [16, 3, 3, 3, 3]  # requests submitted before the cut drain; no 0.7x cut per cool-down


def test_a_queue_where_the_window_already_fits_only_arms_the_fit_bound() -> None:
    ctl, engine = sixteen_agents(), VllmLike()
    ctl.observe(engine.scrape(8, 0.2, 1, 0), 0.0)
    assert ctl.observe(engine.scrape(8, 0.8, 24, 10), 0.25).window == 16  # 0.7 x 25 fit: no cut
    assert ctl.observe(engine.scrape(8, 0.9, 9, 0), 0.5).window == 13  # the bound follows the fit: 0.7 x 19.4


@pytest.mark.parametrize(("name", "scrapes", "window"), [
    ("requests queued for the budget while the cache has room", [(0.3, 6, 4)] * 5, 16),
    ("a full cache with nothing queued", [(0.99, 4, 0)] * 5, 16),
    ("no queue gauge at all (an older engine)", [(0.99, 4, None)] * 5, 16),
])
def test_no_queue_at_a_full_cache_keeps_the_batch(name: str, scrapes: list[tuple[float, float, float | None]],
                                                  window: int) -> None:
    ctl, engine = sixteen_agents(), VllmLike()
    for i, (u, r, q) in enumerate(scrapes):
        sample = engine.scrape(8, u, r, 0.0 if q is None else q)
        if q is None:
            sample = CacheSample(usage=sample.usage, prefix_queries=sample.prefix_queries,
                                 prefix_hits=sample.prefix_hits, preemptions=0.0, generated=sample.generated,
                                 running=r)
        assert ctl.observe(sample, 0.25 * i).window == window, name


@pytest.mark.parametrize(("samples", "cut_at"), [(1, 1), (2, 2), (3, 3), (0, None)])
def test_queue_samples_is_how_many_scrapes_in_a_row_must_show_it(samples: int, cut_at: int | None) -> None:
    ctl, engine = sixteen_agents(queue_samples=samples), VllmLike()
    scrapes = [(0.4, 3, 0), (0.71, 4, 12), (0.95, 4, 10), (0.97, 5, 10), (0.9, 4, 11)]
    windows = [ctl.observe(engine.scrape(8, u, r, q), 0.25 * i).window for i, (u, r, q) in enumerate(scrapes)]
    first_cut = next((i for i, w in enumerate(windows) if w < 16), None)
    assert first_cut == cut_at


def test_a_queue_that_clears_restarts_the_count() -> None:
    ctl, engine = sixteen_agents(queue_samples=2), VllmLike()
    scrapes = [(0.95, 4, 3), (0.95, 4, 0), (0.95, 4, 3), (0.5, 4, 3), (0.95, 4, 3)]
    windows = [ctl.observe(engine.scrape(8, u, r, q), 0.25 * i).window for i, (u, r, q) in enumerate(scrapes)]
    assert windows == [16] * 5  # never two scrapes in a row


def test_bad_queue_samples_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="queue_samples"):
        ClimbConfig(queue_samples=-1)


def test_our_engine_exports_the_queue_under_vllms_name() -> None:
    page = render(EngineCounters(usage=0.9, running=3, waiting=5))
    assert "vllm:num_requests_waiting" in page
    sample = sample_from(parse_text(page))
    assert sample is not None and (sample.running, sample.waiting) == (3.0, 5.0)
    assert queue_binds(sample)


@pytest.mark.parametrize(("page", "running", "waiting"), [
    ('vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running{engine="0"} 3\n'
     'vllm:num_requests_waiting{engine="0"} 9\nvllm:num_requests_waiting{engine="1"} 2\n', 3.0, 11.0),
    ("vllm:kv_cache_usage_perc 0.5\n", None, None),
    ("sglang:token_usage 0.8\nsglang:num_running_reqs 4\nsglang:num_queue_reqs 6\n", 4.0, 6.0),
])
def test_the_scrape_reads_the_queue(page: str, running: float | None, waiting: float | None) -> None:
    sample = sample_from(parse_text(page))
    assert sample is not None and (sample.running, sample.waiting) == (running, waiting)
