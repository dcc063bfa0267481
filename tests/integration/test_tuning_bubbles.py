"""Bubble windows from a stage's compute edges, and a real process squeezed into them with signals."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from rota.jobkit.tuning.bubbles import BubbleClock, task_cpu_ns


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, wanted: set[str]) -> str:
    deadline = time.monotonic() + 5
    while (state := _state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _edges(clock: BubbleClock, t: FakeTime, pattern: list[tuple[float, float]]) -> None:
    for start, end in pattern:
        t.now = start
        clock.compute_start()
        t.now = end
        clock.compute_end()
    clock.step_boundary()


def test_gaps_between_compute_intervals_are_the_bubble_windows() -> None:
    t = FakeTime()
    clock = BubbleClock(clock=t, min_bubble_s=0.5)
    _edges(clock, t, [(0, 1), (3, 4), (4.2, 5)])  # gaps of 2 s and 0.2 s (too short to count)
    _edges(clock, t, [(10, 11)])  # the time between steps is not a bubble of either
    assert [(s, e) for s, e, _ in clock.bubbles] == [(1, 3)]
    assert clock.compute == [(0, 1), (3, 4), (4.2, 5), (10, 11)]
    summary = clock.summary()
    assert summary["bubble_s"] == 2 and summary["windows"] == 1
    assert summary["bubble_busy"] is not None and 0 <= summary["bubble_busy"] <= 1


def test_a_squeezed_process_runs_only_in_windows_predicted_long_enough(sleeper: subprocess.Popen[bytes]) -> None:
    t = FakeTime()
    clock = BubbleClock(squeeze_pid=sleeper.pid, clock=t, min_squeeze_s=1.0)
    assert task_cpu_ns(sleeper.pid) >= 0
    # First step: nothing known yet, so the process is never resumed (nor stopped).
    _edges(clock, t, [(0, 1), (3, 4), (4.5, 5)])
    assert clock.resumed == []
    # Second step: window 0 was 2 s long last step -> resumed inside it, stopped at its end.
    t.now = 10
    clock.compute_start()
    t.now = 11
    clock.compute_end()
    assert _wait_state(sleeper.pid, {"S", "R"}) in {"S", "R"}
    t.now = 13
    clock.compute_start()
    assert _wait_state(sleeper.pid, {"T"}) == "T"
    t.now = 14
    clock.compute_end()  # window 1 was 0.5 s last step: not worth the signals
    assert _state(sleeper.pid) == "T"
    t.now = 14.5
    clock.compute_start()
    assert clock.resumed == [(11, 13)]
