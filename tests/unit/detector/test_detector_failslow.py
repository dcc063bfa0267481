"""Fail-slow on hand-built reports: sequence lengths must not trigger it; a persistent 1.2× must."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from rota.core.detection.failslow import (
    JOB,
    SLOW,
    DetectorConfig,
    Episodes,
    FailSlowDetector,
    RawBaseline,
    Verdict,
)
from rota.core.detection.layout import IterationReport, Layout, MicroBatch
from rota.core.errors import InvalidArgument

# The true cost of every micro-batch on every stage, written out here (not taken from the
# cost model under test): each packed sequence of l tokens costs 0.4 s per 10⁴ tokens
# (projections, MLP) plus 0.3 s per 10⁸ of l² (attention).
SECONDS_PER_TOKEN = 0.4 / 10_000
SECONDS_PER_SQUARED_TOKEN = 0.3 / 100_000_000


def true_seconds(mb: MicroBatch) -> float:
    return sum(SECONDS_PER_TOKEN * length + SECONDS_PER_SQUARED_TOKEN * length * length for length in mb)


def two_stage_1f1b_seconds(first: float, second: float) -> float:
    """The critical path of a 1F1B pipeline of 2 stages and 2 micro-batches costing `first`
    and `second` on each stage, split evenly into forward, backward and weight-gradient
    thirds u and v. Stage 0 runs F0 F1 B0 W0 B1 W1, stage 1 runs F0 B0 W0 F1 B1 W1; stage 0
    ends last, after its B1 (which waits for stage 1's B1) and W1. The chains into stage 1's
    F1 (4u, or u + v), into stage 0's B0 (5u, or 3u + v) and the rest give, by hand:"""
    u, v = first / 3, second / 3
    return max(5 * u, 4 * u + 2 * v, u + 3 * v) + 2 * v
SHAPES: list[tuple[MicroBatch, ...]] = [  # micro-batches of one replica, short to very long sequences
    ((2048,) * 8, (4096,) * 4),
    ((16384,), (16384,)),
    ((8192, 8192), (1024,) * 16),
    ((30000,), (512,) * 32),
]
CONFIG = DetectorConfig(threshold=1.1, consecutive=5, warmup=20)


def report(it: int, layout: Layout, slow: dict[int, float] | None = None, step_extra: float = 0.0,
           shape: int | None = None) -> IterationReport:
    """An iteration of a noiseless job whose micro-batch shapes cycle (or stay at `shape`)."""
    micro = tuple(SHAPES[(it + d) % len(SHAPES) if shape is None else shape] for d in range(layout.dp))
    seconds = []
    for r in range(layout.ranks):  # a rank is busy for each micro-batch of its replica
        busy = sum(true_seconds(mb) for mb in micro[layout.replica(r)])
        seconds.append(busy * (slow or {}).get(r, 1.0))
    if not step_extra:
        return IterationReport(it, layout, tuple(seconds), micro)
    assert (layout.pp, layout.dp) == (2, 1) and all(len(m) == 2 for m in micro[0:1])  # what the formula covers
    first, second = (true_seconds(mb) for mb in micro[0])
    return IterationReport(it, layout, tuple(seconds), micro, two_stage_1f1b_seconds(first, second) + step_extra)


def run(detector: FailSlowDetector | RawBaseline, reports: list[IterationReport]) -> list[Verdict]:
    return list(itertools.chain.from_iterable(detector.observe(r) for r in reports))


def test_micro_batch_cost_is_modelled_so_long_sequences_alone_never_trigger() -> None:
    layout = Layout(2, 2, 1)
    reports = [report(it, layout) for it in range(400)]
    assert run(FailSlowDetector(layout, CONFIG), reports) == []


def test_the_raw_baseline_flags_the_same_sequence_variation() -> None:
    layout = Layout(2, 2, 1)
    # Three short iterations then runs of long ones: raw time jumps well past its median.
    reports = [report(it, layout, shape=0 if (it // 6) % 3 else 3) for it in range(400)]
    assert run(FailSlowDetector(layout, CONFIG), reports) == []
    assert len(run(RawBaseline(layout, CONFIG), reports)) > 0


@pytest.mark.parametrize(("factor", "rank", "layout"), [
    (1.2, 3, Layout(2, 2, 1)),
    (1.2, 0, Layout(1, 4, 1)),
    (1.5, 6, Layout(2, 2, 2)),
    (3.0, 1, Layout(2, 1, 2)),
])
def test_a_persistent_slowdown_is_flagged_after_k_iterations_on_its_own_rank(factor: float, rank: int, layout: Layout) -> None:
    start = 60
    reports = [report(it, layout, {rank: factor} if it >= start else None) for it in range(120)]
    verdicts = run(FailSlowDetector(layout, CONFIG), reports)
    assert [(v.rank, v.kind, v.iteration) for v in verdicts] == [(rank, SLOW, start + CONFIG.consecutive - 1)]
    assert verdicts[0].ratio == pytest.approx(factor)
    assert verdicts[0].evidence["stage"] == layout.stage(rank)
    assert verdicts[0].evidence["rank_ratios"] == [pytest.approx(factor)] * CONFIG.consecutive


def test_a_slowdown_shorter_than_k_iterations_is_a_hiccup_not_a_verdict() -> None:
    layout = Layout(2, 2, 1)
    reports = [report(it, layout, {1: 2.0} if 60 <= it < 60 + CONFIG.consecutive - 1 else None) for it in range(120)]
    assert run(FailSlowDetector(layout, CONFIG), reports) == []


def test_a_slowdown_below_the_threshold_is_tolerated() -> None:
    layout = Layout(2, 2, 1)
    reports = [report(it, layout, {1: 1.05} if it >= 60 else None) for it in range(200)]
    assert run(FailSlowDetector(layout, CONFIG), reports) == []


def test_a_device_slow_from_the_start_is_found_against_its_fastest_peer() -> None:
    layout = Layout(2, 2, 2)  # four ranks share each stage's model
    reports = [report(it, layout, {5: 1.3}) for it in range(60)]
    verdicts = run(FailSlowDetector(layout, CONFIG), reports)
    assert [(v.rank, v.iteration) for v in verdicts] == [(5, CONFIG.warmup + CONFIG.consecutive - 1)]


def test_a_slow_step_that_no_rank_explains_names_the_job() -> None:
    layout = Layout(1, 2, 1)
    reports = [report(it, layout, step_extra=0.5 if it < 60 else 20.0) for it in range(100)]
    verdicts = run(FailSlowDetector(layout, CONFIG), reports)
    assert [(v.rank, v.kind, v.iteration) for v in verdicts] == [(JOB, SLOW, 60 + CONFIG.consecutive - 1)]


def test_a_repeated_report_counts_once() -> None:
    layout = Layout(1, 2, 1)
    detector = FailSlowDetector(layout, CONFIG)
    reports = [report(it, layout, {1: 2.0} if it >= 30 else None) for it in range(33)]
    run(detector, reports)
    assert run(detector, [reports[-1]] * 10) == []


def test_a_rank_that_recovers_for_k_iterations_can_be_flagged_again() -> None:
    layout = Layout(1, 2, 1)
    slow_at = set(range(30, 40)) | set(range(60, 70))
    reports = [report(it, layout, {0: 1.5} if it in slow_at else None) for it in range(100)]
    assert [v.iteration for v in run(FailSlowDetector(layout, CONFIG), reports)] == [34, 64]


@pytest.mark.parametrize(("overs", "opened"), [
    ([True] * 3, [False, False, True]),
    ([True, True, False, True, True, True], [False, False, False, False, False, True]),
    ([True] * 3 + [False] * 2 + [True] * 3, [False, False, True] + [False] * 5),  # still flagged: calm < k
    ([True] * 3 + [False] * 3 + [True] * 3, [False, False, True] + [False] * 5 + [True]),
])
def test_episodes_open_after_k_overs_and_close_after_k_calms(overs: list[bool], opened: list[bool]) -> None:
    episodes = Episodes(3)
    assert [episodes.update(7, o) for o in overs] == opened


@pytest.mark.parametrize(("observed_over_predicted", "verdicts"), [(2.0, 1), (1.05, 0)])
def test_a_predicted_step_time_is_the_expectation_before_the_job_s_own_is_learned(
    observed_over_predicted: float, verdicts: int,
) -> None:
    layout = Layout(tp=1, pp=1, dp=1)
    detector = FailSlowDetector(layout, DetectorConfig(threshold=1.1, consecutive=5, warmup=50))
    reports = []
    for it in range(10):  # all inside the warm-up: the learned model does not exist yet
        base = report(it, layout)
        predicted = 0.01
        reports.append(dataclasses.replace(base, iteration_seconds=predicted * observed_over_predicted,
                                           predicted_seconds=predicted))
    found = run(detector, reports)
    assert len(found) == verdicts
    if verdicts:
        assert (found[0].rank, found[0].kind, found[0].iteration) == (JOB, SLOW, 4)  # the k-th over
        assert found[0].evidence["expected_iteration_seconds"] == 0.01
    assert not detector.ready


def test_without_a_prediction_the_warm_up_judges_nothing() -> None:
    layout = Layout(tp=1, pp=1, dp=1)
    detector = FailSlowDetector(layout, DetectorConfig(threshold=1.1, consecutive=5, warmup=50))
    assert run(detector, [dataclasses.replace(report(it, layout), iteration_seconds=1.0) for it in range(10)]) == []


def test_a_prediction_that_is_not_a_finite_time_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as refused:
        dataclasses.replace(report(0, Layout(tp=1, pp=1, dp=1)), predicted_seconds=float("inf"))
    assert refused.value.field == "predicted_iteration_seconds"
