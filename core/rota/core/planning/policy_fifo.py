"""The FIFO baseline of docs/design.md §3, exactly: what every figure is measured against.

Each realtime app reserves its peak demand for the whole horizon. Batch-like jobs start
in strict arrival order (start times never decrease along the queue), each in the lowest
aligned block free for its whole in-horizon duration among the starts its placement
constraints allow (GPU types, one switch); priority is ignored. A job that
cannot start inside the horizon holds back every job behind it (head-of-line blocking).
"""

from __future__ import annotations

from rota.core.planning.constraints import StartMasks
from rota.core.planning.grid import Plan, highest_bits, pinned_board
from rota.core.planning.scenario import BatchJob, Scenario


def arrival_queue(s: Scenario) -> list[BatchJob]:
    """Batch-like jobs not yet running, by arrival, ties broken by their order in the file."""
    rank = {job_id: i for i, job_id in enumerate(s.order)}
    waiting = [j for j in s.batch if j.running is None]
    return sorted(waiting, key=lambda j: (j.arrival, rank.get(j.id, len(rank))))


def plan(s: Scenario) -> Plan:
    b = pinned_board(s)
    masks = StartMasks(s)
    for r in s.realtime:
        # The reservation takes the highest GPUs free for the whole horizon, so batch blocks
        # pack from GPU 0 upwards without straddling it; short of GPUs, it takes what there is.
        taken = highest_bits(b.free_mask(0, s.horizon) & masks.rows_for(r.gpu_types), max(r.demand, default=0))
        for t in range(s.horizon):
            b.place_mask(r.id, taken, t)
    floor = 0
    for j in arrival_queue(s):
        start = max(floor, j.arrival)
        allowed = masks.allowed(j)  # the starts its GPU types and switch leave it
        while start < s.horizon:
            first = b.lowest_block(j.gpus, start, min(start + j.duration, s.horizon), allowed)
            if first is not None:
                b.place_block(j.id, first, j.gpus, start, start + j.duration)
                break
            start += 1
        if start >= s.horizon:
            break  # it starts past the horizon, and so does everyone queued behind it
        floor = start
    return Plan(b.cells)
