"""The synthetic job generator: declared guesses, solved token counts, reproducibility."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from rota.bench import forecast_workload as generator
from rota.bench.forecast_workload import (
    declared,
    quant_job,
    solve_tokens,
    training_job,
    true_training_seconds,
)


@pytest.mark.parametrize(("guess", "nice"), [(1000, 900), (2600, 3600), (2500, 1800), (5 * 3600, 6 * 3600), (30 * 86400, 30 * 86400)])
def test_declared_durations_round_a_guess_to_the_nearest_round_figure(guess: float, nice: float,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generator, "OPTIMISM_SIGMA", 0.0)
    monkeypatch.setattr(generator, "OPTIMISM_MEDIAN", 1.0)
    assert declared(guess, random.Random(0)) == nice


def test_users_are_optimistic_by_about_a_third_at_the_median() -> None:
    rng = random.Random(0)
    guesses = sorted(declared(36000.0, rng) / 36000.0 for _ in range(2001))
    assert 0.55 < guesses[1000] < 0.85


def test_the_solved_token_count_gives_the_wanted_duration_to_two_significant_figures() -> None:
    rng = random.Random(3)
    job = training_job(rng, 8, 20 * 3600)
    assert job.actual_s == pytest.approx(20 * 3600, rel=0.06)  # tokens are rounded to 2 figures
    assert job.expected_s == pytest.approx(true_training_seconds(job.features), rel=1e-12)  # type: ignore[arg-type]
    total = job.features.tokens * job.features.epochs  # type: ignore[union-attr]
    assert float(f"{total:.2g}") == pytest.approx(total, rel=1e-12)


def test_a_job_shorter_than_its_startup_cannot_be_solved() -> None:
    shape = training_job(random.Random(1), 1, 3600).features
    assert solve_tokens(shape, 10.0) is None  # type: ignore[arg-type]


def test_generation_is_reproducible_by_seed() -> None:
    a = [training_job(random.Random(9), 4, 7200.0) for _ in range(2)]
    assert a[0] == a[1]
    assert quant_job(random.Random(4)) == quant_job(random.Random(4))


def test_a_quantization_job_drawn_for_a_target_fits_its_gpus() -> None:
    job = quant_job(random.Random(2), actual_s=3 * 3600, gpus=2)
    assert job.gpus == 2 and job.kind == "quantization"


def test_a_quantization_job_drawn_for_an_actual_duration_carries_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    # The features' noise-free time must be the actual duration over the drawn noise, as a
    # training job's is; features chosen nearest the actual itself would leak it.
    monkeypatch.setattr(generator, "noise", lambda rng, sigma: 2.0)
    rng = random.Random(11)
    jobs = [quant_job(rng, actual_s=3 * 3600, gpus=8) for _ in range(100)]
    assert all(j.actual_s == 3 * 3600 for j in jobs)
    assert statistics.median(math.log(j.expected_s / j.actual_s) for j in jobs) < -0.4  # about -log 2
