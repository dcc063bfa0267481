"""The 1F1B pipeline schedule and its critical path (pure).

Every micro-batch j passes each stage s three times: forward F(s, j), backward B(s, j) (the
input gradient, which the previous stage waits for) and weight update W(s, j) (the weight
gradient, which nobody downstream waits for). Stage s runs p − s − 1 warm-up forwards,
then alternates one forward with one backward (each followed by its W), then drains the
remaining backwards. The iteration takes as long as the last chunk to finish: the length
of the longest dependency chain, which is what a slow stage stretches and what variable
sequence lengths move around.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

# Shares of a micro-batch's cost on one stage: forward, backward (input grad), weight grad.
CHUNKS = (1 / 3, 1 / 3, 1 / 3)

Op = tuple[str, int]  # ("F" | "B" | "W", micro-batch)


@cache
def schedule(m: int, p: int) -> tuple[tuple[Op, ...], ...]:
    """The op order of each stage under 1F1B with `m` micro-batches and `p` stages."""
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops: list[Op] = [("F", j) for j in range(warm)]
        f = warm
        for b in range(m):
            if f < m:
                ops.append(("F", f))
                f += 1
            ops += [("B", b), ("W", b)]
        orders.append(tuple(ops))
    return tuple(orders)


def makespan(cost: Sequence[Sequence[float]]) -> float:
    """Time to run one iteration of one pipeline; cost[s][j] = micro-batch j on stage s.

    Each stage runs its ops in schedule order, an op starting once the stage is free and
    its input is ready: F(s, j) needs F(s−1, j); B(s, j) needs B(s+1, j) (the last stage's
    needs its own F). The result is the critical path of the schedule's dependency graph.
    """
    p = len(cost)
    m = len(cost[0]) if p else 0
    if p == 0 or m == 0:
        return 0.0
    orders = schedule(m, p)
    fwd = [[-1.0] * m for _ in range(p)]
    bwd = [[-1.0] * m for _ in range(p)]
    free = [0.0] * p
    at = [0] * p
    left = sum(len(o) for o in orders)
    f_share, b_share, w_share = CHUNKS
    while left:
        progressed = False
        for s in range(p):
            order = orders[s]
            while at[s] < len(order):
                kind, j = order[at[s]]
                if kind == "F":
                    ready = 0.0 if s == 0 else fwd[s - 1][j]
                    if ready < 0:
                        break
                    free[s] = fwd[s][j] = max(free[s], ready) + f_share * cost[s][j]
                elif kind == "B":
                    ready = fwd[s][j] if s == p - 1 else bwd[s + 1][j]
                    if ready < 0:
                        break
                    free[s] = bwd[s][j] = max(free[s], ready) + b_share * cost[s][j]
                else:
                    free[s] += w_share * cost[s][j]
                at[s] += 1
                left -= 1
                progressed = True
        if not progressed:  # cannot happen for 1F1B; guards against an endless loop
            raise RuntimeError("pipeline schedule deadlocked")
    return max(free)


def uniform_makespan(stage_seconds: Sequence[float], m: int) -> float:
    """Makespan when every micro-batch costs the same on a stage (what re-plans compare)."""
    return makespan([[t] * m for t in stage_seconds])
