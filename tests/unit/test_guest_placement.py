"""Trials placed into running pipelines' bubbles (rota.core.planning.guests): table-driven."""

from __future__ import annotations

import pytest

from rota.core.planning.guests import BubbleHost, GuestCandidate, GuestStart, bubble_fraction, place_guests


def host(job_id: str, fraction: float, gpus: tuple[int, ...] = (0, 1), lent: tuple[int, ...] = (), node: str = "n1",
         gpu_type: str = "") -> BubbleHost:
    return BubbleHost(job_id, node, gpus, fraction, frozenset(lent), gpu_type)


def trial(job_id: str, gpus: int = 1, priority: int = 0, types: tuple[str, ...] = ()) -> GuestCandidate:
    return GuestCandidate(job_id, gpus, priority, types)


@pytest.mark.parametrize(
    ("hosts", "trials", "placed"),
    [
        ([host("h", 0.4)], [trial("t")], [("t", "h", (0,))]),
        ([host("h", 0.1)], [trial("t")], []),
        ([host("small", 0.3), host("big", 0.6)], [trial("t")], [("t", "big", (0,))]),
        ([host("h", 0.4)], [trial("a"), trial("b"), trial("c")], [("a", "h", (0,)), ("b", "h", (1,))]),
        ([host("h", 0.4, lent=(0,))], [trial("t")], [("t", "h", (1,))]),
        ([host("h", 0.4, lent=(0, 1))], [trial("t")], []),
        ([host("h", 0.4)], [trial("wide", gpus=2)], [("wide", "h", (0, 1))]),
        ([host("h", 0.4, gpus=(0,))], [trial("wide", gpus=2)], []),
        ([host("h", 0.4, gpus=(0,))], [trial("low"), trial("high", priority=5)], [("high", "h", (0,))]),
        ([host("h", 0.4, gpu_type="a100")], [trial("t", types=("h100",))], []),
        ([host("a", 0.3, gpu_type="a100"), host("h", 0.5, gpu_type="h100")], [trial("t", types=("a100",))],
         [("t", "a", (0,))]),
        ([host("h", 0.4)], [trial("none", gpus=0)], []),
        ([], [trial("t")], []),
    ],
    ids=["a trial goes into a host's bubbles", "too few bubbles: no guest", "the host with most bubbles first",
         "one guest per GPU", "a lent GPU is not lent twice", "every GPU lent: no room",
         "a 2-GPU trial takes two of one host", "a host too small for the trial", "higher priority first",
         "a type the trial refuses", "the host of an accepted type", "a trial of no GPUs is no guest",
         "no hosts"],
)
def test_place_guests(hosts: list[BubbleHost], trials: list[GuestCandidate], placed: list[tuple[str, str, tuple[int, ...]]]) -> None:
    starts = place_guests(hosts, trials)
    assert [(s.job_id, s.host_job_id, s.gpus) for s in starts] == placed
    assert all(isinstance(s, GuestStart) and s.node == "n1" for s in starts)


@pytest.mark.parametrize(
    ("progress", "fraction"),
    [
        ({"step_s": 0.2, "bubble_s": 0.05}, 0.25),
        ({"step_s": 0.2}, None),
        ({"bubble_s": 0.05}, None),
        ({"step_s": 0, "bubble_s": 0}, None),
        ({"step_s": 0.1, "bubble_s": 0.2}, None),
        ({"step_s": 0.1, "bubble_s": -0.01}, None),
        ({"step_s": "0.2", "bubble_s": 0.05}, None),
        ({"step_s": True, "bubble_s": 0.5}, None),
    ],
    ids=["bubbles over the step", "no bubbles reported", "no step time", "an empty step",
         "more bubble than step", "negative bubble", "a string", "a boolean"],
)
def test_bubble_fraction_believes_only_a_sane_report(progress: dict[str, object], fraction: float | None) -> None:
    assert bubble_fraction(progress) == (pytest.approx(fraction) if fraction is not None else None)


@pytest.mark.parametrize(
    ("free_mb", "memory_mb", "placed"),
    [(4096.0, 512, True), (512.0, 512, True), (256.0, 512, False), (None, 512, False), (None, 0, True),
     (0.0, 0, True)],
    ids=["room to spare", "exactly enough", "too little free", "a host that does not say: not for a trial that does",
         "a trial that says nothing fits", "even beside a full stage"],
)
def test_a_trial_that_says_its_memory_goes_only_where_the_stage_leaves_that_much(
        free_mb: float | None, memory_mb: int, placed: bool) -> None:
    h = BubbleHost("h", "n1", (0,), 0.4, frozenset(), "", free_mb)
    assert bool(place_guests([h], [GuestCandidate("t", 1, 0, (), memory_mb)])) is placed


@pytest.mark.parametrize(
    ("progress", "free"),
    [({"bubble_free_mb": 2048}, 2048.0), ({}, None), ({"bubble_free_mb": -1}, None),
     ({"bubble_free_mb": "lots"}, None), ({"bubble_free_mb": False}, None)],
    ids=["a number", "not reported", "negative", "a string", "a boolean"],
)
def test_free_memory_is_read_only_from_a_sane_report(progress: dict[str, object], free: float | None) -> None:
    from rota.core.planning.guests import free_memory_mb

    assert free_memory_mb(progress) == free
