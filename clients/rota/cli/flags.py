"""Converters of the CLI's enumerated flags: a value outside the list fails as one line that
names the flag and lists the values (`rota: --state: unknown state 'RUNNIN' (one of ...)`),
never as the wire's own enum error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rota.v1 import common_pb2

# In the wire's order (PENDING, SCHEDULED, RUNNING, ...), without its UNSPECIFIED.
JOB_STATES = tuple(name.removeprefix("JOB_STATE_") for name in common_pb2.JobState.keys()
                   if name != "JOB_STATE_UNSPECIFIED")


def one_of(flag: str, what: str, value: str, values: Sequence[str]) -> str:
    """`value` when it is one of `values` (their spelling, whatever the case it was typed in)."""
    for known in values:
        if value.strip().lower() == known.lower():
            return known
    raise ValueError(f"{flag}: unknown {what} {value!r} (one of {', '.join(values)})")


def job_states(values: Iterable[str], flag: str = "--state") -> list[str]:
    return [one_of(flag, "state", v, JOB_STATES) for v in values]
