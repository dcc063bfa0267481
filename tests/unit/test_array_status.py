"""`rota explain ARRAY` (rota.core.array_status): tasks counted, and why the waiting ones wait."""

from __future__ import annotations

import pytest

from rota.core.array_status import TaskGroup, explain_array
from rota.core.dependencies import cap_reason, waiting_reason

A = "j-0a1b2c3d4e"


@pytest.mark.parametrize(("max_running", "groups", "lines"), [
    (2, [TaskGroup("RUNNING", "running on node-1", 2, 0), TaskGroup("PENDING", cap_reason(A, 2), 3, 2),
         TaskGroup("SUCCEEDED", "exit 0", 1, 5)],
     [f"array {A}: 6 tasks, at most 2 at once: 2 running, 3 waiting, 1 finished (1 succeeded)",
      "3 wait for the array's %2 cap (2 of at most 2 run at once)"]),
    (0, [TaskGroup("PENDING", waiting_reason("j-ffffffffff", "succeeded"), 4, 0)],
     [f"array {A}: 4 tasks: 0 running, 4 waiting, 0 finished",
      "4 wait for a dependency: waits for j-ffffffffff to succeed"]),
    (0, [TaskGroup("PENDING", "waiting: planned at step 3, after j-9 ends", 2, 4),
         TaskGroup("PENDING", "waiting: planned at step 2, after j-8 ends", 1, 1),
         TaskGroup("CANCELLED", "cancelled", 1, 0), TaskGroup("PAUSED", "paused", 1, 9)],
     [f"array {A}: 5 tasks: 0 running, 3 waiting, 1 paused, 1 finished (1 cancelled)",
      f"3 wait for the plan; the first, {A}_1: planned at step 2, after j-8 ends"]),
    (0, [TaskGroup("SUCCEEDED", "", 3, 0)],
     [f"array {A}: 3 tasks: 0 running, 0 waiting, 3 finished (3 succeeded)"]),
])
def test_an_array_is_explained_by_its_tasks(max_running: int, groups: list[TaskGroup], lines: list[str]) -> None:
    count = sum(g.count for g in groups)
    assert explain_array(A, count, max_running, groups).splitlines() == lines
