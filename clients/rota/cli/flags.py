"""Converters of the CLI's enumerated flags: a value outside the list fails as one line that
names the flag and lists the values (`rota: --state: unknown state 'RUNNIN' (one of ...)`),
never as the wire's own enum error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rota.client.enums import JobState

# The SDK's states, in the order of a job's life (PENDING, SCHEDULED, RUNNING, PAUSED, ...).
JOB_STATES = tuple(state.value for state in JobState)


def one_of(flag: str, what: str, value: str, values: Sequence[str]) -> str:
    """`value` when it is one of `values` (their spelling, whatever the case it was typed in)."""
    for known in values:
        if value.strip().lower() == known.lower():
            return known
    raise ValueError(f"{flag}: unknown {what} {value!r} (one of {', '.join(values)})")


def job_states(values: Iterable[str], flag: str = "--state") -> list[str]:
    return [one_of(flag, "state", v, JOB_STATES) for v in values]
