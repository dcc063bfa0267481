"""Iteration reports and rank heartbeats from a training job to the failure detector (docs/design.md §7).

A pipeline-parallel job calls, once per iteration (from the rank that gathers the times)::

    from rota.runtime import report_iteration
    report_iteration(step, rank_seconds=times, micro_batches=lengths, tp=2, pp=4, dp=2,
                     iteration_seconds=wall)

- ``rank_seconds[r]``: rank r's busy (compute) time in the iteration, None if unknown;
  ranks are numbered tp fastest, then pp, then dp (r = t + tp·(s + pp·d));
- ``micro_batches[d][j]``: the sequence lengths packed into replica d's j-th micro-batch;
- ``stage_of_rank`` (optional): each rank's pipeline stage when it differs from the numbering.

Each report also counts as a heartbeat of every rank whose time it carries;
:func:`heartbeat` beats for ranks between reports (call it at least once a heartbeat
interval when an iteration takes longer). A rank silent for three intervals is declared
dead and the job goes to its restart policy.

Protocol with the agent (like progress reports): when ``ROTA_ITERATIONS_FILE`` is set,
each call appends one JSON line with a single ``write``; the agent forwards the lines to
the detector. Unset (outside Rota) the calls only validate. Pure standard library.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

from rota.runtime.progress import _append_line

__all__ = ["ENV_ITERATIONS_FILE", "heartbeat", "report_iteration"]

ENV_ITERATIONS_FILE = "ROTA_ITERATIONS_FILE"
#: One line may hold at most this many bytes of JSON.
MAX_LINE_BYTES = 1 << 20


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _seconds(rank_seconds: Sequence[float | None], ranks: int) -> list[float | None]:
    if len(rank_seconds) != ranks:
        raise ValueError(f"rank_seconds has {len(rank_seconds)} values; tp*pp*dp = {ranks} ranks")
    out: list[float | None] = []
    for r, s in enumerate(rank_seconds):
        if s is None:
            out.append(None)
            continue
        value = float(s)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"rank_seconds[{r}] must be a finite time of at least 0, got {s!r}")
        out.append(value)
    return out


def _micro_batches(micro_batches: Sequence[Sequence[Sequence[int]]], dp: int) -> list[list[list[int]]]:
    if len(micro_batches) != dp:
        raise ValueError(f"micro_batches has {len(micro_batches)} replicas; dp = {dp}")
    if len({len(mbs) for mbs in micro_batches}) != 1 or not micro_batches[0]:
        raise ValueError("every replica must run the same number (at least one) of micro-batches")
    out = []
    for d, mbs in enumerate(micro_batches):
        replica = []
        for j, mb in enumerate(mbs):
            lengths = [int(n) for n in mb]
            if not lengths or any(n < 1 for n in lengths):
                raise ValueError(f"micro_batches[{d}][{j}] must hold sequence lengths of at least 1")
            replica.append(lengths)
        out.append(replica)
    return out


def _write(line: dict[str, object]) -> None:
    data = (json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n").encode()
    if len(data) > MAX_LINE_BYTES:
        raise ValueError(f"iteration report is {len(data)} bytes; at most {MAX_LINE_BYTES} are allowed")
    path = os.environ.get(ENV_ITERATIONS_FILE)
    if path:
        _append_line(path, data)


def report_iteration(
    iteration: int, *, rank_seconds: Sequence[float | None], micro_batches: Sequence[Sequence[Sequence[int]]],
    tp: int, pp: int, dp: int, iteration_seconds: float = 0.0, stage_of_rank: Sequence[int] | None = None,
    predicted_seconds: float = 0.0,
) -> None:
    """Report one iteration (see the module docstring). Raises ValueError naming what is wrong.

    `predicted_seconds`: the step time the job expects (an overlap plan's `predicted_step_s`),
    which the detector holds the steps to until it has learned the job's own times."""
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an integer of at least 0, got {iteration!r}")
    ranks = _positive("tp", tp) * _positive("pp", pp) * _positive("dp", dp)
    wall = float(iteration_seconds)
    if not math.isfinite(wall) or wall < 0:
        raise ValueError(f"iteration_seconds must be a finite time of at least 0, got {iteration_seconds!r}")
    layout: dict[str, object] = {"tp": tp, "pp": pp, "dp": dp}
    if stage_of_rank is not None:
        stages = [int(s) for s in stage_of_rank]
        if len(stages) != ranks or any(not 0 <= s < pp for s in stages):
            raise ValueError(f"stage_of_rank must give a stage in 0..{pp - 1} for each of the {ranks} ranks")
        layout["stages"] = stages
    predicted = float(predicted_seconds)
    if not math.isfinite(predicted) or predicted < 0:
        raise ValueError(f"predicted_seconds must be a finite time of at least 0, got {predicted_seconds!r}")
    line: dict[str, object] = {"iteration": iteration, "rank_seconds": _seconds(rank_seconds, ranks),
                               "micro_batches": _micro_batches(micro_batches, dp), "layout": layout,
                               "iteration_seconds": wall}
    if predicted:
        line["predicted_seconds"] = predicted
    _write(line)


def heartbeat(*ranks: int) -> None:
    """A heartbeat of these ranks (e.g. ``heartbeat(0, 1)``); needed only between reports."""
    if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
        raise ValueError(f"heartbeat needs one or more ranks (integers of at least 0), got {ranks!r}")
    _write({"beat": list(ranks)})
