"""The sequential (CUSUM) fail-slow test: noisy ratio series, table-driven; and the detector in mode "cusum"."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rota.core.detection.failslow import CUSUM, SLOW, DetectorConfig, FailSlowDetector
from rota.core.detection.layout import IterationReport, Layout
from rota.core.detection.sequential import Cusum, SequentialConfig, robust_sigma, run_length, threshold_for
from rota.core.errors import InvalidArgument

SIGMA = 0.13  # the per-iteration noise on the ratio the real job showed on 2 contended cores


def noisy(n: int, seed: int, sigma: float = SIGMA) -> list[float]:
    """Healthy ratios: lognormal noise around 1."""
    rng = random.Random(seed)
    return [math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def first_alarm(cusum: Cusum, series: list[float]) -> int | None:
    for i, ratio in enumerate(series):
        if cusum.update(ratio):
            return i
    return None


def calibrated(seed: int = 1000) -> Cusum:
    return Cusum.calibrated(noisy(200, seed), series=5, config=SequentialConfig())


@pytest.mark.parametrize(("kappa", "target"), [(0.7, 16_667), (0.35, 1_000), (1.2, 100_000), (0.1, 500)])
def test_the_threshold_reaches_the_target_run_length_and_no_lower_one_does(kappa: float, target: float) -> None:
    h = threshold_for(kappa, target)
    assert run_length(kappa, h) >= target
    assert run_length(kappa, h * 0.99) < target


@pytest.mark.parametrize(("ratios", "sigma"), [
    ([1.0] * 10, 0.0),
    ([math.e, 1 / math.e, 1.0], 1.4826),
    ([1.0, 1.0, math.exp(0.1), math.exp(-0.1), 100.0], 1.4826 * 0.1),  # one outlier moves nothing
])
def test_sigma_is_the_scaled_median_absolute_deviation_of_the_logs(ratios: list[float], sigma: float) -> None:
    assert robust_sigma(ratios) == pytest.approx(sigma)


CASES = [  # (name, series after 40 healthy iterations, alarm expected)
    ("no fault", [1.0] * 400, False),
    ("persistent 1.2x", [1.2] * 80, True),
    ("persistent 1.5x", [1.5] * 40, True),
    ("a 3-iteration 1.5x transient", [1.5] * 3 + [1.0] * 100, False),
    ("a 3-iteration 5x transient", [5.0] * 3 + [1.0] * 100, False),
    ("a 2x hiccup every 10 iterations", ([2.0] + [1.0] * 9) * 20, False),
    ("0.8x: a faster rank", [0.8] * 300, False),
]


@pytest.mark.parametrize(("name", "fault", "alarm"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cases_under_realistic_noise(name: str, fault: list[float], alarm: bool, seed: int) -> None:
    cusum = calibrated()
    noise = noisy(40 + len(fault), seed)
    series = [n * (1.0 if i < 40 else fault[i - 40]) for i, n in enumerate(noise)]
    at = first_alarm(cusum, series)
    assert (at is not None) == alarm, (name, at)
    if at is not None:
        assert at >= 40 + cusum.min_iterations() - 1  # never on less evidence than the clip allows


@pytest.mark.parametrize(("sigma_seed_scale", "persist"), [(1.0, 8), (0.3, 8), (0.3, 4), (2.0, 12)])
def test_an_alarm_needs_at_least_persist_iterations_whatever_the_noise(sigma_seed_scale: float, persist: int) -> None:
    config = SequentialConfig(persist=persist, window=1)
    cusum = Cusum.calibrated(noisy(200, 5, SIGMA * sigma_seed_scale), 5, config)
    assert cusum.min_iterations() >= persist
    at = first_alarm(cusum, [100.0] * 50)  # as slow as can be, from the first iteration
    assert at is not None and at + 1 >= persist


def test_a_larger_target_false_rate_alarms_sooner() -> None:
    series = noisy(40, 7) + [1.2 * n for n in noisy(100, 8)]
    strict = Cusum.calibrated(noisy(200, 9), 5, SequentialConfig(false_per_1k=0.1))
    loose = Cusum.calibrated(noisy(200, 9), 5, SequentialConfig(false_per_1k=10.0))
    assert loose.h < strict.h
    a, b = first_alarm(strict, series), first_alarm(loose, series)
    assert a is not None and b is not None and b <= a


def test_one_episode_one_alarm_and_it_closes_when_the_rank_recovers() -> None:
    cusum = calibrated()
    series = [1.5] * 30 + [1.0] * 30 + [1.5] * 30
    alarms = [i for i, r in enumerate(series) if cusum.update(r)]
    assert len(alarms) == 2 and alarms[0] < 30 and alarms[1] >= 60


@pytest.mark.parametrize(("field", "value"), [
    ("shift", 1.0), ("false_per_1k", 0.0), ("window", 0), ("clip", 1.0), ("persist", 0), ("sigma_scale", 0.0),
    ("sigma_floor", -1.0),
])
def test_bad_settings_name_their_field(field: str, value: float) -> None:
    with pytest.raises(InvalidArgument, match=field):
        SequentialConfig(**{field: value})  # type: ignore[arg-type]


def test_a_bad_mode_names_its_field() -> None:
    with pytest.raises(InvalidArgument, match="mode"):
        DetectorConfig(mode="vote")


# The detector in mode "cusum", with common-mode normalisation, on a 4-stage job whose
# every micro-batch costs 1 ms per 100 tokens plus 1 ms per 10⁴ of l² on every stage.
LAYOUT = Layout(1, 4, 1)
SEQUENTIAL = DetectorConfig(warmup=50, mode=CUSUM, common_mode=True)


def cost(lengths: tuple[int, ...]) -> float:
    return sum(1e-5 * n + 1e-7 * n * n for n in lengths)


def job(n: int, seed: int, slow: dict[int, float], from_iter: int, everyone: float = 1.0) -> list[IterationReport]:
    """Per iteration: noise per rank, and with probability 0.2 a contention burst that
    slows every stage by `everyone` (the cores' other work)."""
    rng = random.Random(seed)
    out = []
    for it in range(n):
        micro = tuple(tuple(rng.choice((32, 64, 128, 256)) for _ in range(rng.randint(1, 6))) for _ in range(4))
        burst = everyone if rng.random() < 0.2 else 1.0
        seconds = tuple(sum(cost(mb) for mb in micro) * burst * math.exp(rng.gauss(0, 0.08))
                        * (slow.get(r, 1.0) if it >= from_iter else 1.0) for r in range(4))
        out.append(IterationReport(it, LAYOUT, seconds, (micro,)))
    return out


@pytest.mark.parametrize(("slow", "everyone", "expected"), [
    ({}, 1.0, []),
    ({}, 1.6, []),  # contention on every stage at once is no device's fault
    ({2: 1.2}, 1.6, [2]),
    ({0: 1.5}, 1.0, [0]),
])
@pytest.mark.parametrize("seed", [11, 12])
def test_the_detector_in_cusum_mode_names_only_the_slow_rank(
        slow: dict[int, float], everyone: float, expected: list[int], seed: int) -> None:
    detector = FailSlowDetector(LAYOUT, SEQUENTIAL)
    verdicts = list(itertools.chain.from_iterable(detector.observe(r) for r in job(200, seed, slow, 100, everyone)))
    assert [v.rank for v in verdicts] == expected
    assert all(v.kind == SLOW and v.iteration >= 100 for v in verdicts)
