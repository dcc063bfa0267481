"""EASY backfilling (Lifka 1995; Mu'alem & Feitelson 2001) on the durations the planner believes.

Jobs start in arrival order until one does not fit: that head gets a reservation at the
shadow time, when (by the running jobs' planned ends) enough GPUs will be free for it.
A later job may jump ahead if it fits now and either its planned end comes before the
shadow time or it uses only GPUs the head will not need then (`extra`). No preemption.

The plan reads `Job.planned` (`rota sim --durations`); the jobs run their true
durations. A job whose planned duration is unknown (`none`: infinite) holds its GPUs
until it ends as far as the plan knows, so the shadow time is unknown and nothing
backfills: FIFO, as a scheduler without estimates must be.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rota.sim.engine import RUNNING, Run, Simulator, TryPlace


def shadow(free: int, ends: list[tuple[float, int]], need: int, now: float) -> tuple[float, int]:
    """(when `need` GPUs will be free, GPUs free beyond `need` then) from (planned end, GPUs) of the running jobs."""
    if free >= need:  # free enough, but fragmented: the head waits for the buddy, not for time
        return now, free - need
    for end, gpus in sorted(ends):
        if not math.isfinite(end):
            break
        free += gpus
        if free >= need:
            return end, free - need
    return math.inf, 0


@dataclass
class Easy:
    name: str = "easy"
    preemptive: bool = False

    def walk(self, sim: Simulator, now: float, cands: list[Run], try_place: TryPlace, done: Callable[[], bool]) -> None:
        queue = sorted(cands, key=lambda r: (r.job.submit_s, r.idx))
        ends = [(max(now, r.work_start + r.job.planned), r.gpus) for r in sim.runs if r.state == RUNNING]
        i = 0
        while i < len(queue) and not done() and try_place(queue[i]):
            ends.append((now + queue[i].job.planned, queue[i].gpus))
            i += 1
        if i >= len(queue) or done():
            return
        when, extra = shadow(sim.alloc.free_gpus, ends, queue[i].gpus, now)
        for r in queue[i + 1 :]:
            if done():
                return
            if math.isfinite(when) and now + r.job.planned <= when:
                try_place(r)
            elif r.gpus <= extra and try_place(r):
                extra -= r.gpus
