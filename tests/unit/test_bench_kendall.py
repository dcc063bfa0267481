"""Kendall's tau-b against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from rota.bench.kendall import kendall_tau


def test_identical_and_reversed_rankings() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0


def test_one_swap_among_four() -> None:
    # 6 pairs, one discordant: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)


def test_ties_use_tau_b() -> None:
    # x = [1, 2, 2, 3], y = [1, 2, 3, 4]: C = 5, D = 0, one tie in x only.
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(5 * 6))


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ValueError, match="length"):
        kendall_tau([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 2"):
        kendall_tau([1], [1])
    with pytest.raises(ValueError, match="constant"):
        kendall_tau([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match=r"y\[1\]"):
        kendall_tau([1, 2], [1, float("nan")])
