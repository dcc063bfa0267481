"""The full policy: docs/design.md §3's five constraints and objective in OR-Tools CP-SAT.

This is the only module that imports ortools. `plan` improves fast's grid in two ways:

- a large-neighbourhood search (full_search) re-solves one window of aligned GPU rows at
  a time, everything else fixed; its exact step is `solve_window` here, a small model of
  a box per job (rows x steps) in one no-overlap-2d;
- on a few nodes (up to WHOLE_MODEL_GPUS) the whole scenario is then solved in one model,
  hinted with the search's grid: the interval model docs/design.md §9 measured to work on these
  machines (a boolean per GPU x job x step found nothing in 10 s at 64 GPUs):
  - each waiting batch-like job has a presence literal, a start, and an in-horizon length
    min(duration, H - start); one optional interval per aligned block it may take (its
    start masks: GPU types, one switch), exactly one of which is present when it is;
  - each realtime app has a literal per (GPU, step), a unit interval on that GPU, a swap
    count per step bounded by max_swap, and an unmet count per step;
  - every GPU carries a no-overlap over the intervals that touch it (pinned jobs fixed).
  Its value is linear in a literal per step the job runs. It runs under a short time
  limit with probing off (docs/design.md §9: otherwise a complete hint is not even taken in time),
  and its grid is returned only when it scores better than the hint. Past 16 GPUs it ends
  where it was hinted, so it is not run there.
"""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from rota.core.planning import full_search, full_search_window, policy_fast
from rota.core.planning.constraints import StartMasks
from rota.core.planning.full_search_window import Window, WindowJob
from rota.core.planning.grid import Board, Grid, Plan, cells_by_job, pinned_board
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import BatchJob, RealtimeApp, Scenario

SCALE = 1000  # CP-SAT wants integer coefficients; the objective is kept to 1e-3
WHOLE_MODEL_GPUS = 16  # up to this many GPUs the whole model follows the window search


def _blocks(allowed: int) -> list[int]:
    """The first GPUs of the blocks a start mask allows."""
    return [i for i in range(allowed.bit_length()) if allowed >> i & 1]


def plan(s: Scenario, time_limit: float = 2.0, workers: int = 2, seed: int = 0,
         iterations: int | None = None) -> Plan:
    """The best grid found in `time_limit` seconds (never worse than fast's). `iterations`
    bounds the window search's count instead, for a run that repeats exactly.

    Fast's grid goes through the window search first; on a few nodes the search has at
    most a quarter of the time (it runs out of windows in 0.1-0.7 s there) and the whole
    model, hinted with its grid, the rest. Each finds what the other misses: in 2 s on the
    bench's 8- and 16-GPU scenarios the windows alone gain 0.7-7% where the whole model
    finds nothing, and on uniform-priority the whole model alone about 20% (trading
    realtime GPU-steps for batch value, which the windows keep fixed), the two together
    26-30%.
    """
    started = time.perf_counter()
    masks = StartMasks(s)
    packed = policy_fast.pack(s, masks)
    small = s.gpus <= WHOLE_MODEL_GPUS
    board, stats = full_search.improve(s, packed, solve_window, time_limit / 4 if small else time_limit, seed,
                                      iterations, started, masks)
    if small:
        whole = _whole(s, board.cells, started + time_limit, workers, seed, started, masks)
        whole.stats.update({k: v for k, v in stats.items() if k not in whole.stats}, method="lns+whole")
        return whole
    # No objective in the stats: measuring 8,192 x 24 cells would cost what the search had
    # left; `lns_gain` is what it added to fast's, and readers re-measure the grid anyway.
    stats.update(method="lns", status="FEASIBLE", solve_ms=(time.perf_counter() - started) * 1000)
    return Plan(board.cells, stats)


def _whole(s: Scenario, hint: Grid, deadline: float, workers: int, seed: int, started: float,
           masks: StartMasks) -> Plan:
    """The whole scenario in one model, hinted with `hint`; its grid if it scores better.
    CP-SAT stops a little before `deadline` (a perf_counter time), kept for reading its grid."""
    hint_obj = measure(s, hint).objective
    held = cells_by_job(hint)
    base = pinned_board(s)
    H, G = s.horizon, s.gpus
    w = [s.decay**t for t in range(H)]
    m = cp_model.CpModel()
    per_gpu = _pinned_intervals(m, base, H, G)

    objective: list[cp_model.LinearExprT] = []
    usage: list[list[cp_model.LinearExprT]] = [[] for _ in range(H)]  # GPUs in use per step
    chosen: dict[str, tuple[cp_model.IntVar, cp_model.IntVar, dict[int, cp_model.IntVar]]] = {}
    waiting = [j for j in s.batch if j.running is None and j.arrival < H]
    for j in waiting:
        if masks.allowed(j):  # a job no block may take stays out of the model
            chosen[j.id] = _batch_job(m, s, j, w, held.get(j.id), per_gpu, objective, usage, masks.allowed(j))

    cells: dict[tuple[str, int, int], cp_model.IntVar] = {}
    for r in s.realtime:
        have = held.get(r.id, [set() for _ in range(H)])
        _realtime_job(m, s, r, have, base, masks.rows_for(r.gpu_types), per_gpu, objective, usage, cells)
    for t in range(H):
        m.add(sum(usage[t]) <= G - base.busy[t].bit_count())
    for intervals in per_gpu:
        if len(intervals) > 1:
            m.add_no_overlap(intervals)
    m.maximize(sum(objective))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, deadline - time.perf_counter() - 0.05)
    solver.parameters.num_workers = workers
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    stats: dict[str, float | int | str] = {"method": "whole", "status": solver.status_name(status),
                                          "hint_objective": hint_obj}
    grid = hint
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        candidate = _extract(s, base.cells, solver, chosen, cells)
        if measure(s, candidate).objective > hint_obj + 1e-6:
            grid = candidate
    objective_value = measure(s, grid).objective
    stats.update(objective=objective_value, solve_ms=(time.perf_counter() - started) * 1000)
    if status != cp_model.UNKNOWN:  # UNKNOWN: the limit ran out before any bound was proved
        # The model leaves out the pinned jobs' value, a constant: add it back to the bound.
        bound = solver.best_objective_bound / SCALE + _pinned_value(s, w)
        bound = max(bound, objective_value) if status == cp_model.OPTIMAL else bound
        stats.update(bound=bound, gap=max(0.0, bound - objective_value) / max(abs(bound), 1e-9))
    return Plan(grid, stats)


def _pinned_intervals(m: cp_model.CpModel, base: Board, H: int, G: int) -> list[list[cp_model.IntervalVar]]:
    """Per GPU, the intervals of its pinned cells (the model's other intervals join them)."""
    per_gpu: list[list[cp_model.IntervalVar]] = [[] for _ in range(G)]
    for g in range(G):
        for t in range(H):
            if base.busy[t] >> g & 1:  # pinned: a fixed unit interval is enough
                per_gpu[g].append(m.new_fixed_size_interval_var(t, 1, f"pin_{g}_{t}"))
    return per_gpu


def _realtime_job(
    m: cp_model.CpModel, s: Scenario, r: RealtimeApp, have: list[set[int]], base: Board, rows: int,
    per_gpu: list[list[cp_model.IntervalVar]], objective: list[cp_model.LinearExprT],
    usage: list[list[cp_model.LinearExprT]], cells: dict[tuple[str, int, int], cp_model.IntVar],
) -> None:
    """A realtime app's cells (only on `rows`, its GPU types: no replica elsewhere), its unmet
    demand in the objective, and its swap limit per step."""
    H, G = s.horizon, s.gpus
    targets = policy_fast.realtime_targets(r)
    z: dict[tuple[int, int], cp_model.IntVar] = {}
    for t in range(H):
        for g in range(G):
            if base.busy[t] >> g & 1 or not rows >> g & 1:
                continue
            z[g, t] = v = m.new_bool_var(f"{r.id}_{g}_{t}")
            m.add_hint(v, int(g in have[t]))
            per_gpu[g].append(m.new_optional_fixed_size_interval_var(t, 1, v, f"{r.id}_i_{g}_{t}"))
            cells[r.id, g, t] = v
        count = sum(z[g, t] for g in range(G) if (g, t) in z)
        # Holding more than the ramped target never helps; capping it prunes the search.
        m.add(count <= min(targets[t], G))
        usage[t].append(count)
        unmet = m.new_int_var(0, r.demand[t], f"{r.id}_unmet_{t}")
        m.add(unmet >= r.demand[t] - count)
        m.add_hint(unmet, max(0, r.demand[t] - len(have[t])))
        objective.append(-round(SCALE * s.realtime_penalty) * unmet)
        if t == 0:
            if r.held:  # a live app: moves from the GPUs it holds now count at step 0
                was = set(r.held)
                m.add(sum(1 - z[g, 0] if g in was else z[g, 0] for g in range(G) if (g, 0) in z)
                      + sum(1 for g in was if (g, 0) not in z) <= r.max_swap)
            continue
        m.add(sum(_realtime_moves(m, r, z, have, t, G)) <= r.max_swap)


def _realtime_moves(m: cp_model.CpModel, r: RealtimeApp, z: dict[tuple[int, int], cp_model.IntVar],
                    have: list[set[int]], t: int, G: int) -> list[cp_model.IntVar]:
    """A literal per GPU that the app takes or leaves between steps t-1 and t."""
    moves = []
    for g in range(G):
        a, b = z.get((g, t - 1)), z.get((g, t))
        if a is None and b is None:
            continue
        c = m.new_bool_var(f"{r.id}_mv_{g}_{t}")
        m.add_hint(c, int((g in have[t]) != (g in have[t - 1])))
        if a is not None and b is not None:
            m.add(c >= a - b)
            m.add(c >= b - a)
        else:
            m.add(c >= (a if a is not None else b))  # type: ignore[operator]
        moves.append(c)
    return moves


def _batch_job(
    m: cp_model.CpModel, s: Scenario, j: BatchJob, w: list[float], have: list[set[int]] | None,
    per_gpu: list[list[cp_model.IntervalVar]], objective: list[cp_model.LinearExprT],
    usage: list[list[cp_model.LinearExprT]], allowed: int,
) -> tuple[cp_model.IntVar, cp_model.IntVar, dict[int, cp_model.IntVar]]:
    H = s.horizon
    present = m.new_bool_var(f"{j.id}_on")
    start = m.new_int_var(j.arrival, H - 1, f"{j.id}_start")
    length = m.new_int_var(1, min(j.duration, H - j.arrival), f"{j.id}_len")
    m.add_min_equality(length, [j.duration, H - start])  # only in-horizon cells exist
    end = m.new_int_var(j.arrival + 1, H, f"{j.id}_end")
    m.add(end == start + length)
    on: dict[int, cp_model.IntVar] = {}
    first_hint = None
    hs = j.arrival  # the hinted start; an absent job keeps its arrival as a harmless value
    if have is not None:
        hs = next(t for t, g in enumerate(have) if g)
        first_hint = min(have[hs])
    he = hs + min(j.duration, H - hs)
    m.add_hint(start, hs)
    m.add_hint(length, he - hs)
    m.add_hint(end, he)
    m.add_hint(present, int(have is not None))
    # A literal per step it runs: the decayed value is linear in them, and their sum per
    # step against the free GPUs gives the LP a capacity cut (an element over the start
    # left the bound far above anything reachable).
    for t in range(j.arrival, H):
        a, after, before = m.new_bool_var(f"{j.id}_run_{t}"), m.new_bool_var(""), m.new_bool_var("")
        m.add(start <= t).only_enforce_if(after)
        m.add(start > t).only_enforce_if(after.Not())
        m.add(end > t).only_enforce_if(before)
        m.add(end <= t).only_enforce_if(before.Not())
        m.add_bool_and([present, after, before]).only_enforce_if(a)
        m.add_bool_or([present.Not(), after.Not(), before.Not()]).only_enforce_if(a.Not())
        objective.append(round(SCALE * j.priority * j.gpus * w[t]) * a)
        usage[t].append(j.gpus * a)
        m.add_hint(after, int(hs <= t))
        m.add_hint(before, int(t < he))
        m.add_hint(a, int(have is not None and hs <= t < he))
    for first in _blocks(allowed):
        on[first] = x = m.new_bool_var(f"{j.id}_at_{first}")
        m.add_hint(x, int(first == first_hint))
        iv = m.new_optional_interval_var(start, length, end, x, f"{j.id}_iv_{first}")
        for g in range(first, first + j.gpus):
            per_gpu[g].append(iv)
    m.add(sum(on.values()) == present)
    return present, start, on


def _pinned_value(s: Scenario, w: list[float]) -> float:
    return sum(j.priority * j.gpus * sum(w[: j.running.started + j.duration]) for j in s.batch if j.running)


def _extract(
    s: Scenario, pinned: Grid, solver: cp_model.CpSolver,
    chosen: dict[str, tuple[cp_model.IntVar, cp_model.IntVar, dict[int, cp_model.IntVar]]],
    cells: dict[tuple[str, int, int], cp_model.IntVar],
) -> Grid:
    grid = [row[:] for row in pinned]
    for job_id, (present, start, on) in chosen.items():
        if not solver.boolean_value(present):
            continue
        j = s.job(job_id)
        assert isinstance(j, BatchJob)
        t0 = solver.value(start)
        first = next(f for f, x in on.items() if solver.boolean_value(x))
        for g in range(first, first + j.gpus):
            for t in range(t0, min(t0 + j.duration, s.horizon)):
                grid[g][t] = job_id
    for (job_id, g, t), v in cells.items():
        if solver.boolean_value(v):
            grid[g][t] = job_id
    return grid


def solve_window(win: Window, deterministic_s: float, wall_s: float, seed: int) -> dict[str, tuple[int, int]] | None:
    """The best placement CP-SAT finds for a window's jobs (full_search_window.Solve), hinted with
    where they are now: {job: (start, first row relative to the window)} for those placed.

    Each job is a box, rows x steps, in one no-overlap-2d with the window's fixed cells:
    its first row a variable over the starts it may take, its steps an optional interval
    whose start is chosen by a literal per step. Those literals carry its value exactly and
    its GPUs at each step against the free rows (a cut the LP needs: without it the bound
    stays far off and small windows are not proved). A job placed outside the window and
    offered to it (`stay` > 0) earns only what it gains by moving. Probing is off and one
    worker runs under deterministic time, so the answer repeats for a seed.
    """
    began = time.perf_counter()
    m = cp_model.CpModel()
    h, rows = win.horizon, win.rows
    xs, ys = _held_boxes(m, win)
    usage: list[list[cp_model.LinearExprT]] = [[] for _ in range(h)]
    objective: list[cp_model.LinearExprT] = []
    picks: dict[str, tuple[dict[int, cp_model.IntVar], cp_model.IntVar]] = {}
    for j in win.jobs:
        if j.starts:
            picks[j.id] = _window_job(m, win, j, xs, ys, usage, objective)
    for t in range(h):
        if usage[t]:
            m.add(sum(usage[t]) <= rows - win.busy[t].bit_count())
    m.add_no_overlap_2d(xs, ys)
    m.maximize(sum(objective))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.max_deterministic_time = deterministic_s
    solver.parameters.max_time_in_seconds = max(0.01, wall_s - (time.perf_counter() - began))  # building counts
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    out: dict[str, tuple[int, int]] = {}
    for job_id, (at, first) in picks.items():
        t0 = next((t for t, x in at.items() if solver.boolean_value(x)), None)
        if t0 is not None:
            out[job_id] = (t0, solver.value(first))
    return out


def _held_boxes(m: cp_model.CpModel, win: Window) -> tuple[list[cp_model.IntervalVar], list[cp_model.IntervalVar]]:
    """The window's held cells as fixed boxes (rows, steps): one per run of held steps on a row."""
    xs: list[cp_model.IntervalVar] = []
    ys: list[cp_model.IntervalVar] = []
    h = win.horizon
    for g in range(win.rows):
        t = 0
        while t < h:  # each run of held steps on this row: one fixed box
            if not win.busy[t] >> g & 1:
                t += 1
                continue
            stop = t
            while stop < h and win.busy[stop] >> g & 1:
                stop += 1
            xs.append(m.new_fixed_size_interval_var(g, 1, f"row_{g}_{t}"))
            ys.append(m.new_fixed_size_interval_var(t, stop - t, f"steps_{g}_{t}"))
            t = stop
    return xs, ys


def _window_job(
    m: cp_model.CpModel, win: Window, j: WindowJob, xs: list[cp_model.IntervalVar], ys: list[cp_model.IntervalVar],
    usage: list[list[cp_model.LinearExprT]], objective: list[cp_model.LinearExprT],
) -> tuple[dict[int, cp_model.IntVar], cp_model.IntVar]:
    """One window job's box, its value and GPUs per step, and its hint: (its start literals, its first row)."""
    h, starts = win.horizon, j.starts
    at = {t: m.new_bool_var(f"{j.id}_t{t}") for t in range(j.arrival, h)}
    present = m.new_bool_var(f"{j.id}_on")
    m.add(sum(at.values()) == present)
    # Intervals want variables: start, length and end equal their sums over the literals
    # (all 0 when the job is left out, and then its box is absent).
    start, length, end = (m.new_int_var(0, h, f"{j.id}_{n}") for n in ("start", "len", "end"))
    m.add(start == sum(t * x for t, x in at.items()))
    m.add(length == sum(min(j.duration, h - t) * x for t, x in at.items()))
    m.add(end == start + length)
    first = m.new_int_var_from_domain(cp_model.Domain.from_values(starts), f"{j.id}_first")
    xs.append(m.new_optional_fixed_size_interval_var(first, j.gpus, present, f"{j.id}_rows"))
    ys.append(m.new_optional_interval_var(start, length, end, present, f"{j.id}_steps"))
    for t, x in at.items():
        objective.append(round(SCALE * (full_search_window.value(j, t, win.weights) - j.stay)) * x)
        for u in range(t, min(t + j.duration, h)):
            usage[u].append(j.gpus * x)
    hs = j.hint[0] if j.hint else None
    for t, x in at.items():
        m.add_hint(x, int(t == hs))
    m.add_hint(present, int(j.hint is not None))
    hl = min(j.duration, h - hs) if hs is not None else 0
    for v, hv in ((start, hs or 0), (length, hl), (end, (hs or 0) + hl), (first, j.hint[1] if j.hint else starts[0])):
        m.add_hint(v, hv)
    return at, first
