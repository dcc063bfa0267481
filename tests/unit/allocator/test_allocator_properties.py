"""Properties every policy keeps on random small scenarios (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.core.planning import policy_fast, policy_fifo, policy_full
from rota.core.planning.grid import pinned_board
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import Scenario, from_dict

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw: st.DrawFn, pinned: bool = True, min_swap: int = 0) -> Scenario:
    gpus = draw(st.sampled_from([2, 4, 8]))
    horizon = draw(st.integers(3, 8))
    jobs: list[dict[str, Any]] = []
    for i in range(draw(st.integers(0, 2))):
        demand = draw(st.lists(st.integers(0, gpus // 2), min_size=horizon, max_size=horizon))
        jobs.append({"id": f"r{i}", "kind": "realtime", "demand": demand, "max_swap": draw(st.integers(min_swap, 3))})
    taken: set[int] = set()
    for i in range(draw(st.integers(1, 7))):
        size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if s <= gpus]))
        duration = draw(st.integers(1, horizon + 2))
        j: dict[str, Any] = {"id": f"j{i}", "kind": draw(st.sampled_from(["training", "batch_inference", "quantization", "trial"])),
             "priority": draw(st.integers(1, 10)), "gpus": size, "duration": duration,
             "arrival": draw(st.integers(0, horizon))}
        if pinned and draw(st.booleans()) and draw(st.booleans()):
            free = [f for f in range(0, gpus, size) if not taken & set(range(f, f + size))]
            if free:
                first = draw(st.sampled_from(free))
                taken |= set(range(first, first + size))
                j["running"] = {"started": -draw(st.integers(0, duration - 1)), "first_gpu": first}
        jobs.append(j)
    return from_dict({"name": "random", "gpus": gpus, "horizon": horizon, "jobs": jobs})


@SETTINGS
@given(scenarios())
def test_every_policy_makes_a_legal_grid_and_full_is_never_below_fast(s: Scenario) -> None:
    fast = policy_fast.plan(s).grid
    full = policy_full.plan(s, time_limit=0.3, workers=1).grid
    for grid in (policy_fifo.plan(s).grid, fast, full):
        assert violations(s, grid) == []
    assert measure(s, full).objective >= measure(s, fast).objective - 1e-9


# An app with max_swap 0 that holds nothing yet can only meet a later demand by holding
# its peak from step 0 for the whole horizon; fast makes that reservation first and may
# starve another app's ramp for it (a counterexample: r0 wants 2 GPUs at steps 3-4, r1
# with max_swap 0 wants 2 at step 6, one GPU pinned), which FIFO does not. Out of scope here.
@SETTINGS
@given(scenarios(min_swap=1))
def test_fast_never_leaves_more_realtime_demand_unmet_than_fifo(s: Scenario) -> None:
    fifo = measure(s, policy_fifo.plan(s).grid)
    fast = measure(s, policy_fast.plan(s).grid)
    assert fast.realtime_unmet <= fifo.realtime_unmet


@SETTINGS
@given(scenarios(pinned=False))
def test_fast_meets_all_realtime_demand_when_the_ramped_curves_fit_the_cluster(s: Scenario) -> None:
    ramped = [policy_fast.realtime_targets(r) for r in s.realtime]
    if all(sum(col) <= s.gpus for col in zip(*ramped, strict=True)):
        assert measure(s, policy_fast.plan(s).grid).realtime_unmet == 0


@st.composite
def live_scenarios(draw: st.DrawFn) -> Scenario:
    """Realtime apps that already hold GPUs (a live cluster), beside waiting batch jobs."""
    s = draw(scenarios(pinned=False))
    pool = list(range(s.gpus))
    jobs = [j for j in from_dict_jobs(s) if j["kind"] != "realtime"]
    for i in range(draw(st.integers(1, 2))):
        held = draw(st.lists(st.sampled_from(pool), unique=True, max_size=max(0, len(pool) // 2))) if pool else []
        pool = [g for g in pool if g not in held]
        demand = draw(st.lists(st.integers(0, s.gpus // 2), min_size=s.horizon, max_size=s.horizon))
        jobs.append({"id": f"live{i}", "kind": "realtime", "demand": demand, "max_swap": draw(st.integers(0, 3)),
                     "held": held})
    return from_dict({"name": "live", "gpus": s.gpus, "horizon": s.horizon, "jobs": jobs})


def from_dict_jobs(s: Scenario) -> list[dict[str, Any]]:
    from rota.core.planning.scenario import to_dict

    return list(to_dict(s)["jobs"])


@SETTINGS
@given(live_scenarios())
def test_fast_and_full_keep_the_swap_cap_from_the_gpus_a_live_app_holds(s: Scenario) -> None:
    fast = policy_fast.plan(s).grid
    full = policy_full.plan(s, time_limit=0.3, workers=1).grid
    assert violations(s, fast) == []
    assert violations(s, full) == []


def _place_without_shortcut(b: Any, queue: list[Any]) -> None:
    """The queue placed by searching for every job, as place_batch did before it learned
    to skip jobs that an earlier failure rules out."""
    for j in queue:
        spot = policy_fast.earliest_block(b, j, 0)
        if spot is not None:
            b.place_block(j.id, spot[1], j.gpus, spot[0], spot[0] + j.duration)


@SETTINGS
@given(scenarios(), st.integers(0, 3))
def test_fast_skipping_jobs_an_earlier_failure_rules_out_places_exactly_what_a_full_search_does(
    s: Scenario, repeat: int
) -> None:
    # Copies of the queue make failures repeat, as in a burst of identical submissions.
    copies = [replace(j, id=f"{j.id}-{k}") for k in range(repeat + 1) for j in s.batch if j.running is None]
    base = pinned_board(s)
    policy_fast.place_realtime(base, s.realtime)
    skipping, searching = base.copy(), base.copy()
    policy_fast.place_batch(skipping, s, copies)
    _place_without_shortcut(searching, copies)
    assert skipping.cells == searching.cells
