"""The job state machine (pure): which transitions are allowed, and when to retry."""

from __future__ import annotations

import itertools

import pytest

from rota.core import jobstate as js
from rota.core.errors import FailedPrecondition

ALLOWED = {
    (js.PENDING, js.SCHEDULED), (js.PENDING, js.CANCELLED), (js.PENDING, js.FAILED),
    (js.SCHEDULED, js.RUNNING), (js.SCHEDULED, js.SUCCEEDED), (js.SCHEDULED, js.FAILED),
    (js.SCHEDULED, js.CANCELLED), (js.SCHEDULED, js.LOST), (js.SCHEDULED, js.PENDING),
    (js.RUNNING, js.SUCCEEDED), (js.RUNNING, js.FAILED), (js.RUNNING, js.CANCELLED),
    (js.RUNNING, js.LOST), (js.RUNNING, js.PAUSED), (js.RUNNING, js.PENDING),
    (js.PAUSED, js.PENDING), (js.PAUSED, js.CANCELLED),
    (js.LOST, js.PENDING), (js.LOST, js.FAILED),
}
ALL_PAIRS = list(itertools.product(js.ALL_STATES, repeat=2))


@pytest.mark.parametrize(("current", "target"), sorted(ALLOWED), ids=lambda s: s)
def test_allowed(current: str, target: str) -> None:
    assert js.can_transition(current, target)
    js.check_transition(current, target)


FORBIDDEN = sorted(set(ALL_PAIRS) - ALLOWED)


@pytest.mark.parametrize(("current", "target"), FORBIDDEN, ids=lambda s: s)
def test_forbidden(current: str, target: str) -> None:
    assert not js.can_transition(current, target)
    with pytest.raises(FailedPrecondition, match=f"from {current} to {target}"):
        js.check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (js.PENDING, js.RUNNING),  # must be placed first
        (js.PENDING, js.SUCCEEDED),
        (js.PAUSED, js.RUNNING),  # resumes through the queue
        (js.LOST, js.RUNNING),
        (js.SUCCEEDED, js.PENDING),
        (js.CANCELLED, js.PENDING),
        (js.FAILED, js.PENDING),
        (js.RUNNING, js.SCHEDULED),
    ],
)
def test_notable_forbidden(current: str, target: str) -> None:
    assert not js.can_transition(current, target)


@pytest.mark.parametrize("final", sorted(js.FINAL_STATES))
def test_final_states_are_final(final: str) -> None:
    assert not any(js.can_transition(final, t) for t in js.ALL_STATES)


def test_unknown_state_goes_nowhere() -> None:
    assert not js.can_transition("BOGUS", js.PENDING)
    assert not js.can_transition(js.PENDING, "BOGUS")


def test_state_sets() -> None:
    assert js.FINAL_STATES == {js.SUCCEEDED, js.FAILED, js.CANCELLED}
    assert js.HOLDING_STATES == {js.SCHEDULED, js.RUNNING}
    assert len(set(js.ALL_STATES)) == 8


@pytest.mark.parametrize(
    ("restart", "attempts", "max_retries", "expected"),
    [
        ("never", 1, 3, False),
        ("never", 0, 100, False),
        ("on-failure", 1, 3, True),  # first retry after the first launch
        ("on-failure", 3, 3, True),  # the last retry
        ("on-failure", 4, 3, False),  # retries exhausted
        ("on-failure", 1, 0, False),  # no retries allowed
        ("on-failure", 1, 1, True),
        ("on-failure", 2, 1, False),
        ("always", 1, 3, False),  # unknown policies never retry
    ],
)
def test_should_retry(restart: str, attempts: int, max_retries: int, expected: bool) -> None:
    assert js.should_retry(restart, attempts, max_retries) is expected
