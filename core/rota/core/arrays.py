"""Job arrays (pure): the index syntax of `rota submit --array` and the names of the tasks.

An array is one submission that makes one job per index, Slurm's habit: `0-99` (an
inclusive range), `0-99:5` (every fifth), `1,3,5-9` (a list of either), each optionally
ending in `%K` (at most K tasks running at once). A task's id is the array's id, `_`, its
index (`j-0a1b2c3d4e_7`), as Slurm names its tasks `1234_7`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rota.core.errors import InvalidArgument

DEFAULT_MAX_ARRAY = 100_000  # tasks in one array (ROTA_MAX_ARRAY)
MAX_INDEX = 10_000_000  # a task's index stays a small integer (ids, environment, Slurm's limit)
MAX_ARRAY_TEXT = 4096
_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True)
class ArraySpec:
    """The indices of an array's tasks, in the order given, and its cap (0: none)."""

    indices: tuple[int, ...]
    max_running: int = 0


def _bad(reason: str) -> InvalidArgument:
    return InvalidArgument("array", reason)


def parse_array(text: str, *, cap: int = DEFAULT_MAX_ARRAY, max_running: int = 0) -> ArraySpec:
    """`A-B[:STEP][%K]` or a comma list of `N` and `A-B[:STEP]`, then `%K`; `max_running`
    (a separate field on the wire) is the cap when the text has none. Refuses an empty,
    reversed or repeated index set, or one of more than `cap` tasks, naming `array`."""
    if len(text) > MAX_ARRAY_TEXT:
        raise _bad(f"longer than {MAX_ARRAY_TEXT} characters")
    body, percent, limit = text.replace(" ", "").partition("%")
    if percent:
        max_running = _percent_cap(limit, max_running)
    if max_running < 0:
        raise _bad(f"max_running must not be negative (got {max_running})")
    if not body:
        raise _bad("no indices: give a range such as 0-99 or a list such as 1,3,5-9")
    ranges: list[range] = []
    total = 0
    for item in body.split(","):
        r = _item_range(item)
        total += len(r)
        if total > cap:  # counted before any list is built: 0-999999999 costs nothing
            raise _bad(f"more than {cap} tasks (ROTA_MAX_ARRAY)")
        ranges.append(r)
    indices = tuple(i for r in ranges for i in r)
    if len(ranges) > 1:  # one range never repeats
        _refuse_repeats(indices)
    return ArraySpec(indices, max_running)


def _percent_cap(limit: str, max_running: int) -> int:
    """The cap `%K` gives, which must agree with `max_running` when that is set too."""
    if not limit.isdigit() or int(limit) < 1:
        raise _bad(f"%K needs a positive number of tasks at once (got {limit!r})")
    if max_running and max_running != int(limit):
        raise _bad(f"%{limit} and max_running {max_running} disagree")
    return int(limit)


def _refuse_repeats(indices: tuple[int, ...]) -> None:
    if len(set(indices)) == len(indices):
        return
    seen: set[int] = set()
    for i in indices:
        if i in seen:
            raise _bad(f"index {i} is given twice")
        seen.add(i)


def _item_range(item: str) -> range:
    match = _ITEM.match(item)
    if match is None:
        raise _bad(f"cannot read {item!r}: use N, A-B or A-B:STEP (e.g. 0-99, 1,3,5-9, 0-98:2)")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3)) if match.group(3) is not None else 1
    if last < first:
        raise _bad(f"range {item} is reversed ({first} > {last})")
    if step < 1:
        raise _bad(f"step of {item} must be at least 1")
    if last > MAX_INDEX:
        raise _bad(f"index {last} is above {MAX_INDEX}")
    return range(first, last + 1, step)


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}_{index}"


def task_environment(array_id: str, index: int) -> dict[str, str]:
    """What a task's process reads: Rota's names and Slurm's, for scripts written for sbatch."""
    return {
        "ROTA_ARRAY_ID": array_id,
        "ROTA_ARRAY_INDEX": str(index),
        "SLURM_ARRAY_JOB_ID": array_id,
        "SLURM_ARRAY_TASK_ID": str(index),
    }
