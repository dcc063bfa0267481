"""The job state machine (pure). Every transition the control plane makes passes here."""

from __future__ import annotations

from rota.core.errors import FailedPrecondition

PENDING = "PENDING"
SCHEDULED = "SCHEDULED"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
PAUSED = "PAUSED"
LOST = "LOST"

ALL_STATES = (PENDING, SCHEDULED, RUNNING, SUCCEEDED, FAILED, CANCELLED, PAUSED, LOST)
FINAL_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED})
# States in which a job holds GPUs (and its claims exist in Postgres).
HOLDING_STATES = frozenset({SCHEDULED, RUNNING})

_ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({SCHEDULED, CANCELLED, FAILED}),
    # SCHEDULED -> PENDING: the launch failed before the job ran, so it is requeued.
    SCHEDULED: frozenset({RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST, PENDING}),
    # RUNNING -> PENDING: a failed attempt requeued by its restart policy.
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, LOST, PAUSED, PENDING}),
    PAUSED: frozenset({PENDING, CANCELLED}),
    LOST: frozenset({PENDING, FAILED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    return target in _ALLOWED.get(current, frozenset())


def check_transition(current: str, target: str) -> None:
    if not can_transition(current, target):
        raise FailedPrecondition(f"job cannot go from {current} to {target}")


def should_retry(restart: str, attempts: int, max_retries: int) -> bool:
    """After a failed or lost attempt: requeue while the restart policy has retries left.

    `attempts` counts launches so far, so the first retry happens at attempts == 1.
    """
    return restart == "on-failure" and attempts <= max_retries
