"""Dependencies between jobs and the caps of arrays: which waiting jobs may be planned (pure).

A job's `depends_on` lists parents and the condition each must meet: `succeeded` (Slurm's
afterok), `finished` (afterany: any end) or `failed` (afternotok: FAILED or CANCELLED). A
dependent waits while a parent has not ended; once every condition holds it is planned
as any job; when one can no longer hold (the parent ended the other way), it fails.

`gate` is what the allocator asks every plan: from the queue, the parents' states and the
arrays' running counts, which jobs are held back (with the reason `rota explain` shows)
and which must fail. It reads no clock and no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rota.core import jobstate
from rota.core.errors import InvalidArgument

SUCCEEDED, FINISHED, FAILED = "succeeded", "finished", "failed"
CONDITIONS = (SUCCEEDED, FINISHED, FAILED)
MAX_DEPENDENCIES = 64
MAX_JOB_ID = 32
_VERB = {SUCCEEDED: "succeed", FINISHED: "finish", FAILED: "fail"}
HOLDS, WAITS, NEVER = "holds", "waits", "never"


def validate(raw: Sequence[Any]) -> list[dict[str, str]]:
    """The normalised list ({"job", "when"}, `when` defaulting to succeeded), or
    InvalidArgument naming `depends_on[i].job` / `.when`."""
    if len(raw) > MAX_DEPENDENCIES:
        raise InvalidArgument("depends_on", f"more than {MAX_DEPENDENCIES} dependencies")
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise InvalidArgument(f"depends_on[{i}]", "must be a mapping with job and when")
        job, when = str(item.get("job", "") or ""), str(item.get("when", "") or SUCCEEDED)
        if not job or len(job) > MAX_JOB_ID:
            raise InvalidArgument(f"depends_on[{i}].job", "must be a job or array id")
        if when not in CONDITIONS:
            raise InvalidArgument(f"depends_on[{i}].when", f"one of {', '.join(CONDITIONS)} (got {when!r})")
        if job in seen:
            raise InvalidArgument(f"depends_on[{i}].job", f"{job} is named twice")
        seen.add(job)
        out.append({"job": job, "when": when})
    return out


def outcome(when: str, parent_state: str | None) -> str:
    """Whether a condition holds, may still hold (the parent has not ended) or never will.
    None: the parent is gone, which nothing can satisfy."""
    if parent_state is None:
        return NEVER
    if parent_state not in jobstate.FINAL_STATES:
        return WAITS
    if when == FINISHED:
        return HOLDS
    succeeded = parent_state == jobstate.SUCCEEDED
    return HOLDS if succeeded == (when == SUCCEEDED) else NEVER


WAITS_FOR = "waiting: waits for "  # every waiting_reason begins so (rota.core.array_status reads it)


def waiting_reason(parent: str, when: str) -> str:
    return f"{WAITS_FOR}{parent} to {_VERB.get(when, when)}"


def cap_reason(array_id: str, cap: int) -> str:
    """Why a task waits for its array's %K cap (rota.core.array_status recognises it)."""
    return f"waiting: array {array_id} runs {cap} of at most {cap} at once"


def held_back(reason: str) -> bool:
    """Whether a waiting job's reason is a hold of its own submission's (its array's cap,
    a dependency), not the cluster's: the job is not runnable yet."""
    return reason.startswith(WAITS_FOR) or (reason.startswith("waiting: array ") and reason.endswith(" at once"))


def failure_reason(parent: str, when: str, parent_state: str | None) -> str:
    if parent_state is None:
        return f"dependency {parent} no longer exists; it can never {_VERB[when]}"
    ended = {jobstate.SUCCEEDED: "succeeded", jobstate.FAILED: "failed", jobstate.CANCELLED: "was cancelled"}
    return f"dependency {parent} {ended.get(parent_state, parent_state.lower())}; it can no longer {_VERB[when]}"


def array_state(counts: Mapping[str, int]) -> str:
    """An array as one parent: still running while a task has not ended, else SUCCEEDED when
    every task did, else FAILED (or CANCELLED when tasks were cancelled and none failed)."""
    if any(n and s not in jobstate.FINAL_STATES for s, n in counts.items()):
        return jobstate.PENDING
    if counts.get(jobstate.FAILED):
        return jobstate.FAILED
    if counts.get(jobstate.CANCELLED):
        return jobstate.CANCELLED
    return jobstate.SUCCEEDED


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of job -> parents edges as [a, b, ..., a], or None. Parents must exist when a
    job is submitted, so only one batch of new jobs could close a loop; checked all the same."""
    done: set[str] = set()
    for root in edges:
        if root in done:
            continue
        path = [root]
        stack: list[Iterator[str]] = [iter(edges.get(root, ()))]
        while stack:
            parent = next(stack[-1], None)
            if parent is None:  # every parent of path[-1] explored: no cycle through it
                done.add(path.pop())
                stack.pop()
            elif parent in path:
                return [*path[path.index(parent):], parent]
            elif parent not in done:
                path.append(parent)
                stack.append(iter(edges.get(parent, ())))
    return None


@dataclass(frozen=True)
class Queued:
    """A waiting job as the gate sees it: its array (if a task) and its dependencies."""

    id: str
    array_id: str = ""
    depends_on: tuple[tuple[str, str], ...] = ()  # (parent id, when)


@dataclass
class Gate:
    held_back: dict[str, str] = field(default_factory=dict)  # job -> why it is not planned now
    doomed: dict[str, str] = field(default_factory=dict)  # job -> why it fails


def _doom(queue: Sequence[Queued], states: dict[str, str], out: Gate) -> None:
    """Mark in `out.doomed` each job a parent's outcome fails; a doomed job counts as FAILED in `states`."""
    for _ in range(len(queue) + 1):  # dependents come after their parents; a pass or two settles it
        before = len(out.doomed)
        for job in queue:
            if job.id in out.doomed:
                continue
            for parent, when in job.depends_on:
                if outcome(when, states.get(parent)) == NEVER:
                    out.doomed[job.id] = failure_reason(parent, when, states.get(parent))
                    states[job.id] = jobstate.FAILED
                    break
        if len(out.doomed) == before:
            break


def gate(
    queue: Sequence[Queued], parent_states: Mapping[str, str], running: Mapping[str, int],
    max_running: Mapping[str, int],
) -> Gate:
    """`queue` in arrival order; `parent_states`: each parent's state (an array's by
    `array_state`; absent: gone); `running`: an array's tasks holding GPUs now;
    `max_running`: its cap (absent or 0: none). A job that fails counts as FAILED for its
    own dependents in the same pass, so a chain fails at once, not a plan at a time."""
    out = Gate()
    states = dict(parent_states)
    _doom(queue, states, out)
    admitted: dict[str, int] = {}
    for job in queue:
        if job.id in out.doomed:
            continue
        waiting = next(((p, w) for p, w in job.depends_on if outcome(w, states.get(p)) == WAITS), None)
        if waiting is not None:
            out.held_back[job.id] = waiting_reason(*waiting)
            continue
        cap = max_running.get(job.array_id, 0) if job.array_id else 0
        if not cap:
            continue
        busy = running.get(job.array_id, 0) + admitted.get(job.array_id, 0)
        if busy < cap:
            admitted[job.array_id] = admitted.get(job.array_id, 0) + 1
        else:
            out.held_back[job.id] = cap_reason(job.array_id, cap)
    return out
