"""Expected durations for ordering: the Kaplan–Meier restricted mean over same-limit jobs."""

from __future__ import annotations

import pytest

from rota.core.forecasting.history import Past
from rota.core.forecasting.survival import expected_durations, restricted_mean


def test_without_censoring_the_restricted_mean_is_the_sample_mean() -> None:
    assert restricted_mean([1.0, 2.0, 9.0]) == pytest.approx(4.0)
    assert restricted_mean([]) is None
    assert restricted_mean([], [5.0]) is None


def test_running_jobs_raise_the_mean_above_the_finished_ones() -> None:
    finished = [1.0, 1.0, 2.0]
    alone = restricted_mean(finished)
    with_running = restricted_mean(finished, [50.0, 50.0])
    assert alone is not None and with_running is not None
    assert with_running > alone
    # {1, 4} finished, one censored at 2: S = 2/3 from 1 to 4, then 0: mean 1 + 2/3 * 3
    assert restricted_mean([1.0, 4.0], [2.0]) == pytest.approx(3.0)


def test_a_censored_job_tied_with_an_event_was_still_at_risk() -> None:
    # events {2, 4}, one censored at 2: three at risk at 2, so S = 2/3 from 2 to 4 (not 1/2)
    assert restricted_mean([2.0, 4.0], [2.0]) == pytest.approx(2.0 + 2 / 3 * 2.0)


def _job(submit: float, seconds: float, declared: float | None) -> Past:
    return Past(submit, submit + seconds, seconds, 1, 0.0, declared)


def test_jobs_of_the_same_limit_are_the_evidence_and_only_those_before_submission() -> None:
    jobs = [_job(float(i), 10.0, 100.0) for i in range(5)]  # end at 10..14
    jobs += [_job(float(i), 1000.0, 100.0) for i in range(5, 8)]  # still running at t = 20
    jobs += [_job(20.0, 10.0, 100.0), _job(20.0, 10.0, 500.0), _job(12.0, 10.0, 100.0)]
    fallback = [7.0] * len(jobs)
    out = expected_durations(jobs, fallback, min_same=5)
    assert out[:5] == [7.0] * 5  # nothing finished before them
    assert out[9] == 7.0  # another limit: no evidence
    assert out[10] == 7.0  # at t = 12 only three jobs of its limit had finished
    assert out[8] > 10.0  # five finished at 10 s, three running for 13–15 s already
    only_finished = expected_durations([*jobs[:5], jobs[8]], [7.0] * 6, min_same=5)
    assert only_finished[5] == pytest.approx(10.0)


def test_the_fallback_must_match_the_jobs() -> None:
    with pytest.raises(ValueError, match="fallback"):
        expected_durations([_job(0.0, 1.0, 1.0)], [], min_same=1)
