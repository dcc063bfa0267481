"""The node health state machine (pure): the one place that says what a node's health may become.

    ALIVE     heartbeats arrive; the allocator plans on it
    DRAINING  heartbeats arrive; nothing new is planned there, running jobs go on (`rota drain`)
    DEAD      silent past the node timeout (the allocator's verdict, on the database's clock);
              its jobs were lost. Its next heartbeat or registration makes it ALIVE again.

Who moves a node is `rota.cluster.node_lifecycle`, the only writer of `nodes.health`.
"""

from __future__ import annotations

from rota.core.errors import FailedPrecondition

ALIVE = "ALIVE"
DRAINING = "DRAINING"
DEAD = "DEAD"
ALL_HEALTH = (ALIVE, DRAINING, DEAD)
# Health in which a node is heard from and can be declared dead when it falls silent.
BEATING = frozenset({ALIVE, DRAINING})

_ALLOWED: dict[str, frozenset[str]] = {
    ALIVE: frozenset({DRAINING, DEAD}),
    DRAINING: frozenset({ALIVE, DEAD}),
    DEAD: frozenset({ALIVE}),
}


def check(current: str, target: str) -> None:
    if target != current and target not in _ALLOWED.get(current, frozenset()):
        raise FailedPrecondition(f"a node cannot go from {current} to {target}")


def after_beat(current: str) -> str:
    """A heartbeat or a registration: a dead node is back; a drain outlives an agent's restart."""
    return DRAINING if current == DRAINING else ALIVE


def after_drain(current: str, *, undo: bool, node: str) -> str:
    """`rota drain NODE [--undo]`. A DEAD node cannot be drained: its next heartbeat makes it
    ALIVE, which would silently undo the drain."""
    if undo:
        return ALIVE if current == DRAINING else current
    if current == DEAD:
        raise FailedPrecondition(f"node {node} is DEAD; drain it once it is back")
    return DRAINING
