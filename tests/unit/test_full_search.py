"""The window search `full` runs past a few nodes (rota.core.planning.full_search): a legal
grid never below fast's, the same one again for a seed, and windows that keep their word."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rota.bench.allocator_scale import synthetic
from rota.core.planning import full_search, full_search_window, policy_fast, policy_full
from rota.core.planning.constraints import StartMasks
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import Scenario


def typed(s: Scenario) -> Scenario:
    """The scenario on nodes of two types, in switches of three nodes; a job in four wants the
    rarer type, half the gangs one switch."""
    nodes = s.nodes
    batch = tuple(replace(j, gpu_types=frozenset({"h100"}) if k % 4 == 0 and j.gpus <= s.gpus_per_node else frozenset(),
                          same_switch=j.gpus > s.gpus_per_node and k % 2 == 0) for k, j in enumerate(s.batch))
    return replace(s, batch=batch, node_types=tuple("h100" if n % 3 == 2 else "a100" for n in range(nodes)),
                   node_switches=tuple(f"sw{n // 3}" for n in range(nodes)))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("constrained", [False, True], ids=["flat", "typed"])
def test_lns_returns_a_legal_grid_at_least_as_good_as_fast_at_64_gpus(seed: int, constrained: bool) -> None:
    s = synthetic(64, 40, seed)
    s = typed(s) if constrained else s
    plan = policy_full.plan(s, time_limit=1.0, seed=seed)
    assert plan.stats["method"] == "lns"
    assert violations(s, plan.grid) == []
    masks = StartMasks(s)
    for j in s.batch:
        rows = [g for g, row in enumerate(plan.grid) if j.id in row]
        assert not rows or masks.is_allowed(j, rows[0])
    assert measure(s, plan.grid).objective >= measure(s, policy_fast.plan(s).grid).objective - 1e-6


def test_lns_repeats_itself_for_a_seed_and_a_window_count() -> None:
    s = synthetic(256, 150)
    first = policy_full.plan(s, time_limit=60, iterations=30, seed=4)
    again = policy_full.plan(s, time_limit=60, iterations=30, seed=4)
    assert first.grid == again.grid and first.stats["windows"] == 30


def test_lns_finds_what_fast_leaves_on_the_table() -> None:
    # 150 jobs on 256 GPUs: fast starts some late that a re-packed window starts earlier.
    s = synthetic(256, 150)
    plan = policy_full.plan(s, time_limit=60, iterations=40)
    fast = measure(s, policy_fast.plan(s).grid).objective
    got = measure(s, plan.grid).objective
    assert violations(s, plan.grid) == []
    assert got > fast and float(plan.stats["lns_gain"]) == pytest.approx(got - fast, abs=1e-2)


def search(s: Scenario) -> full_search.Search:
    masks = StartMasks(s)
    return full_search.Search(s, policy_fast.pack(s, masks), masks, seed=0)


def test_a_window_answer_that_earns_less_changes_nothing() -> None:
    state = search(synthetic(64, 40))
    win = state.sub_problem(0, 32)
    placed, busy = dict(state.placed), state.busy[:]
    assert any(j.hint for j in win.jobs)
    assert not state.accept(win, {})  # every freed job dropped: a loss
    assert state.placed == placed and state.busy == busy


def test_a_window_answer_off_the_jobs_allowed_starts_or_on_a_held_block_is_refused() -> None:
    s = typed(synthetic(128, 80))
    state = search(s)
    win = state.sub_problem(0, 64)
    picky = next(j for j in win.jobs if j.hint is None and j.allowed and j.allowed != (1 << 64) - 1 and j.gpus == 1)
    banned = next(f for f in range(64) if not picky.allowed >> f & 1)
    with pytest.raises(AssertionError, match="not allowed"):
        state.accept(win, {**{j.id: j.hint for j in win.jobs if j.hint}, picky.id: (picky.arrival, banned)})
    held = next(j for j in win.jobs if j.hint is not None)
    assert held.hint is not None
    start, first = held.hint
    clash = next(j for j in win.jobs if j.hint is None and j.allowed >> first & 1 and j.gpus <= held.gpus
                 and j.arrival <= start)
    with pytest.raises(AssertionError, match="taken"):
        state.accept(win, {**{j.id: j.hint for j in win.jobs if j.hint}, clash.id: (start, first)})


def test_movers_that_move_leave_their_old_block_and_the_others_keep_theirs() -> None:
    # Rows 128-159 of this scenario re-filled greedily take three jobs placed elsewhere
    # (late) and leave the other movers offered where they are.
    state = search(synthetic(256, 150))
    win = state.sub_problem(128, 32)
    answer = full_search_window.recreate(win, state.rng)
    assert answer is not None
    movers = {j.id: state.placed[j.id] for j in win.jobs if j.stay}
    moved = {i for i in movers if i in answer}
    assert moved and set(movers) - moved
    assert state.accept(win, answer)
    assert all(state.placed[i] == spot for i, spot in movers.items() if i not in moved)
    assert all(state.placed[i][1] >= 128 and state.placed[i] != movers[i] for i in moved)
    assert violations(state.s, state.board().cells) == []
