"""Which verdicts take a device out of the plan (pure; docs/design.md §7).

A rank declared dead took its GPU with it as far as the scheduler can tell (a hung
collective and a failed HBM look the same from here), and a device running at half its
expected speed or worse slows every synchronous job placed on it more than a re-plan can
recover. Either way the GPU is marked BAD and the allocator gives it to no job until an
operator, having looked at it, clears it. Milder slowdowns are left to the re-plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rota.core.detection.failslow import JOB, SLOW, STOP, Verdict
from rota.core.errors import InvalidArgument

BAD = "BAD"
CLEARED = "CLEARED"
BEYOND_REPAIR_RATIO = 2.0  # a slow verdict at this ratio or above marks the device bad
MAX_REASON = 512


@dataclass(frozen=True)
class DeviceMark:
    node: str
    gpu: int
    reason: str
    job_id: str
    rank: int
    kind: str


def check_beyond_repair(ratio: float) -> float:
    if not (math.isfinite(ratio) and ratio > 1):
        raise InvalidArgument("beyond_repair", f"must be a ratio above 1 (got {ratio})")
    return ratio


def mark_for(verdict: Verdict, job_id: str, node: str | None, gpu: int | None,
             beyond_repair: float = BEYOND_REPAIR_RATIO) -> DeviceMark | None:
    """The mark a verdict puts on the device its rank ran on, or None when it puts none.

    No mark without a device (a rank that shares its job's GPUs has no GPU of its own, and
    a verdict on the job as a whole names none) or for a slowdown a re-plan can absorb.
    """
    if node is None or gpu is None or verdict.rank == JOB:
        return None
    if verdict.kind == STOP:
        why = str(verdict.evidence.get("why") or f"rank {verdict.rank} missed its heartbeats")
    elif verdict.kind == SLOW and verdict.ratio >= beyond_repair:
        why = (f"rank {verdict.rank} ran {verdict.ratio:.2f}x its expected time at iteration {verdict.iteration} "
               f"(beyond repair from {beyond_repair:g}x)")
    else:
        return None
    return DeviceMark(node, gpu, f"{verdict.kind}: {why}"[:MAX_REASON], job_id, verdict.rank, verdict.kind)

