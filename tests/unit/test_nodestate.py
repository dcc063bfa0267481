"""The node health state machine, table-driven."""

from __future__ import annotations

import pytest

from rota.core import nodestate as ns
from rota.core.errors import FailedPrecondition


@pytest.mark.parametrize(("current", "after"), [(ns.ALIVE, ns.ALIVE), (ns.DRAINING, ns.DRAINING), (ns.DEAD, ns.ALIVE)])
def test_a_beat_revives_the_dead_and_keeps_a_drain(current: str, after: str) -> None:
    assert ns.after_beat(current) == after
    ns.check(current, after)


@pytest.mark.parametrize(("current", "undo", "after"), [
    (ns.ALIVE, False, ns.DRAINING), (ns.DRAINING, False, ns.DRAINING),
    (ns.DRAINING, True, ns.ALIVE), (ns.ALIVE, True, ns.ALIVE), (ns.DEAD, True, ns.DEAD),
])
def test_drain_and_undo(current: str, undo: bool, after: str) -> None:
    assert ns.after_drain(current, undo=undo, node="n") == after


def test_a_dead_node_cannot_be_drained() -> None:
    with pytest.raises(FailedPrecondition, match="node n is DEAD"):
        ns.after_drain(ns.DEAD, undo=False, node="n")


@pytest.mark.parametrize(("current", "target"), [(ns.DEAD, ns.DRAINING)])
def test_transitions_outside_the_table_are_refused(current: str, target: str) -> None:
    with pytest.raises(FailedPrecondition):
        ns.check(current, target)
