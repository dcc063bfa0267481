"""Why an array's tasks wait (pure): what `rota explain ARRAY` and the console's array page say.

An array is many jobs; its explanation counts its tasks (running, waiting, paused,
finished) and says why the waiting ones wait, in the three ways a task can: the array's
%K cap (rota.core.dependencies.cap_reason), a dependency (waiting_reason), or the plan
(the first such task's own explanation: "planned at step 3, after j-... ends").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rota.core import jobstate
from rota.core.arrays import task_id
from rota.core.dependencies import WAITS_FOR, cap_reason

RUNNING_STATES = jobstate.HOLDING_STATES
WAITING_STATES = frozenset({jobstate.PENDING, jobstate.LOST})  # LOST: its node died; it queues again


@dataclass(frozen=True)
class TaskGroup:
    """Tasks of one array alike in state and reason; `first`: the smallest index among them."""

    state: str
    reason: str
    count: int
    first: int


def explain_array(array_id: str, count: int, max_running: int, groups: Sequence[TaskGroup]) -> str:
    """Lines: the tasks counted by what they do, then why the waiting ones wait."""

    def total(states: frozenset[str] | set[str]) -> int:
        return sum(g.count for g in groups if g.state in states)

    finished = {s: total({s}) for s in (jobstate.SUCCEEDED, jobstate.FAILED, jobstate.CANCELLED)}
    cap = f", at most {max_running} at once" if max_running else ""
    parts = [f"{total(RUNNING_STATES)} running", f"{total(WAITING_STATES)} waiting"]
    if total({jobstate.PAUSED}):
        parts.append(f"{total({jobstate.PAUSED})} paused")
    ended = ", ".join(f"{n} {s.lower()}" for s, n in finished.items() if n)
    parts.append(f"{sum(finished.values())} finished" + (f" ({ended})" if ended else ""))
    lines = [f"array {array_id}: {count} tasks{cap}: {', '.join(parts)}"]
    waiting = [g for g in groups if g.state in WAITING_STATES]
    capped = sum(g.count for g in waiting if max_running and g.reason == cap_reason(array_id, max_running))
    if capped:
        lines.append(f"{capped} wait for the array's %{max_running} cap ({max_running} of at most {max_running} run at once)")
    dependencies: dict[str, int] = {}
    for g in waiting:
        if g.reason.startswith(WAITS_FOR):
            why = g.reason.removeprefix("waiting: ")
            dependencies[why] = dependencies.get(why, 0) + g.count
    for why, n in sorted(dependencies.items()):
        lines.append(f"{n} wait for a dependency: {why}")
    planned = [g for g in waiting if not g.reason.startswith(WAITS_FOR)
               and not (max_running and g.reason == cap_reason(array_id, max_running))]
    if planned:
        first = min(planned, key=lambda g: g.first)
        n = sum(g.count for g in planned)
        why = first.reason.removeprefix("waiting: ") or "not planned yet"
        lines.append(f"{n} wait for the plan; the first, {task_id(array_id, first.first)}: {why}")
    return "\n".join(lines)
