"""The fitted step clock of `rota bench concur`: the least-squares fit recovers known costs,
drops a coefficient that would be negative, and its error measure says how far charged
costs lie from measured ones."""

from __future__ import annotations

import random

import pytest

from rota.bench.fitted_clock import fit, fit_error

TRUE = (2e-3, 5e-6, 1e-8, 2e-9)  # step, token, decode context, prefill pair (seconds per unit)


def samples(coefficients: tuple[float, ...], noise: float, n: int = 300,
            seed: int = 0) -> list[tuple[tuple[int, ...], float]]:
    rng = random.Random(seed)
    out: list[tuple[tuple[int, ...], float]] = []
    for _ in range(n):
        work = (rng.randint(1, 512), rng.randint(0, 20_000), rng.randint(0, 200_000))
        cost = coefficients[0] + sum(c * x for c, x in zip(coefficients[1:], work, strict=True))
        out.append((work, cost * (1.0 + rng.uniform(-noise, noise))))
    return out


@pytest.mark.parametrize(("noise", "tolerance", "least_r2"), [(0.0, 1e-6, 0.9999), (0.05, 0.1, 0.95)])
def test_fit_recovers_known_coefficients(noise: float, tolerance: float, least_r2: float) -> None:
    clock = fit(samples(TRUE, noise))
    for got, want in zip(clock.coefficients, TRUE, strict=True):
        assert got == pytest.approx(want, rel=tolerance)
    assert clock.r2 >= least_r2
    held_out = samples(TRUE, noise, seed=1)
    error = fit_error([(clock.cost(w), c) for w, c in held_out])
    assert error["steps"] == len(held_out) and error["r2"] >= least_r2
    assert error["median_rel_error"] <= max(noise, 1e-6)


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted() -> None:
    # cost falls with decode context: no physical step does that; the fit must not charge it negatively
    data = samples((2e-3, 5e-6, -1e-8, 2e-9), 0.0)
    clock = fit(data)
    assert all(c >= 0 for c in clock.coefficients)
    assert clock.coefficients[2] == 0.0
    assert clock.cost((10, 1000, 1000)) > 0


def test_fit_error_of_a_biased_clock_shows_its_bias() -> None:
    measured = [0.01 * (i + 1) for i in range(20)]
    exact = fit_error([(m, m) for m in measured])
    assert exact == {"steps": 20, "r2": 1.0, "median_rel_error": 0.0, "total_rel_error": 0.0}
    slow = fit_error([(1.2 * m, m) for m in measured])
    assert slow["median_rel_error"] == pytest.approx(0.2) and slow["total_rel_error"] == pytest.approx(0.2)
    assert slow["r2"] < 1.0
    assert fit_error([]) == {"steps": 0}


def test_an_idle_step_costs_nothing() -> None:
    clock = fit(samples(TRUE, 0.0))
    assert clock.cost((0, 0, 0)) == 0.0 and clock.cost(()) == 0.0
