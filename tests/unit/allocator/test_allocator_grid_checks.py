"""The legality checker and the docs/design.md §3 metrics, on small hand-drawn grids.

Grids are drawn as strings: a row per GPU, a character per step, '.' idle; `KEY` maps
characters to job ids.
"""

from __future__ import annotations

from typing import Any

import pytest

from rota.core.planning.grid import Grid
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import Scenario, from_dict

KEY = {"A": "a", "B": "b", "R": "run", "c": "chat"}


def draw(*rows: str) -> Grid:
    return [[KEY[ch] if ch != "." else None for ch in row] for row in rows]


def scenario(*jobs: dict[str, Any], gpus: int = 4, horizon: int = 4) -> Scenario:
    return from_dict({"name": "t", "gpus": gpus, "horizon": horizon, "jobs": list(jobs)})


A = {"id": "a", "kind": "training", "priority": 2, "gpus": 2, "duration": 2, "arrival": 0}
B = {"id": "b", "kind": "quantization", "priority": 5, "gpus": 1, "duration": 3, "arrival": 1}
RUN = {"id": "run", "kind": "training", "priority": 3, "gpus": 1, "duration": 3, "running": {"started": -1, "first_gpu": 3}}
CHAT_DEMAND = [1, 2, 2, 1]
CHAT: dict[str, Any] = {"id": "chat", "kind": "realtime", "demand": CHAT_DEMAND, "max_swap": 1}
S = scenario(A, B, RUN, CHAT)

LEGAL = draw(
    "AA..",
    "AA..",
    "cBBB",
    "RRcc",
)

ILLEGAL = [
    ("a batch job with a gap in its run", draw("A.A.", "A.A.", "c...", "RR.."), "expected a contiguous 2-step run"),
    ("a batch job that changes GPUs", draw("A...", "AA..", ".A..", "RR.."), "changes GPUs while it runs"),
    ("a block that is not aligned", draw("....", "AA..", "AA..", "RR.."), "not an aligned block of 2"),
    ("a job holding too few GPUs", draw("AA..", "....", "....", "RR.."), "holds 1 GPUs, it asked for 2"),
    ("a job that starts before it arrives", draw("....", "....", "BBB.", "RR.."), "before its arrival"),
    ("a running job that moved", draw("....", "....", "RR..", "...."), "moved from GPU 3 to 2"),
    ("a running job that was dropped", draw("....", "....", "....", "...."), "was not kept where it is"),
    ("a realtime app moving more GPUs than max_swap", draw("cc..", "..c.", "..c.", "RR.."), "max_swap is 1"),
]


def test_a_grid_that_keeps_the_five_constraints_is_legal() -> None:
    assert violations(S, LEGAL) == []


@pytest.mark.parametrize(("case", "grid", "message"), ILLEGAL, ids=[c[0] for c in ILLEGAL])
def test_the_checker_names_each_broken_constraint(case: str, grid: Grid, message: str) -> None:
    found = violations(S, grid)
    assert any(message in v for v in found), found


def test_a_grid_of_the_wrong_shape_or_with_unknown_jobs_is_rejected() -> None:
    assert violations(S, draw("AA..", "AA..", "RR..")) == ["grid is not 4 GPUs x 4 steps"]
    odd = [row[:] for row in draw("AA..", "AA..", "....", "RR..")]
    odd[2][3] = "ghost"
    assert "unknown job id 'ghost' in the grid" in violations(S, odd)


def test_a_job_running_past_the_horizon_shows_only_its_in_horizon_cells() -> None:
    late = scenario({**A, "duration": 5})
    assert violations(late, draw("....", "....", "..AA", "..AA")) == []


def test_metrics_count_realtime_only_up_to_its_demand() -> None:
    s = scenario(CHAT)
    over = draw("cccc", "cccc", "cccc", "....")  # FIFO-style peak reservation of 3
    m = measure(s, over)
    assert m.utilization == sum(CHAT_DEMAND) / 16
    assert m.realtime_unmet == 0


def test_metrics_value_unmet_and_completed_follow_the_spec() -> None:
    m = measure(S, LEGAL)
    # a: 2 GPUs x 2 steps x p2; b: 3 steps x p5; run: 2 in-horizon steps x p3.
    assert m.value == 2 * 2 * 2 + 3 * 5 + 2 * 3
    # chat wants 1,2,2,1 and holds 1,0,1,1 (GPU2 at t0, GPU3 at t2-3).
    assert m.realtime_unmet == 3
    used = 4 + 3 + 2 + (1 + 0 + 1 + 1)
    assert m.utilization == used / 16
    assert m.completed == 3  # a ends at 2, b at 4, run at 2: all inside the horizon
    w = [0.97**t for t in range(4)]
    decayed = 2 * 2 * (w[0] + w[1]) + 5 * (w[1] + w[2] + w[3]) + 3 * (w[0] + w[1])
    assert m.objective == pytest.approx(decayed - 8.0 * 3)


def test_a_job_that_runs_past_the_horizon_is_not_completed() -> None:
    late = scenario({**A, "duration": 5})
    m = measure(late, draw("....", "....", "..AA", "..AA"))
    assert (m.completed, m.value) == (0, 2 * 2 * 2)


def test_a_live_app_that_moves_more_gpus_than_its_cap_at_step_zero_is_refused() -> None:
    app = {"id": "chat", "kind": "realtime", "demand": [2, 2, 2, 2], "max_swap": 1, "held": [0, 1]}
    s = scenario(app)
    assert violations(s, draw("cccc", "cccc", "....", "....")) == []
    swapped = violations(s, draw("cccc", "....", "cccc", "...."))  # one GPU out and one in: two moves
    assert swapped == ["chat changes 2 of the GPUs it holds at step 0; max_swap is 1"]
    moved = violations(s, draw("....", "....", "cccc", "cccc"))
    assert moved == ["chat changes 4 of the GPUs it holds at step 0; max_swap is 1"]
