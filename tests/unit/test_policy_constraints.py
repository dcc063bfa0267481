"""Every policy keeps to a job's start masks: its GPU types, one switch for a same-switch
gang, and whole nodes for a gang; fast also prefers a gang's block under fewest switches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from builders import batch_job, realtime_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.core.planning import policy_fair, policy_fast, policy_fifo, policy_full
from rota.core.planning.constraints import StartMasks
from rota.core.planning.grid import Grid, Plan, pinned_board
from rota.core.planning.legality import violations
from rota.core.planning.scenario import Scenario, from_dict

POLICIES: dict[str, Callable[[Scenario], Plan]] = {
    "fifo": policy_fifo.plan,
    "fast": policy_fast.plan,
    "fair": policy_fair.plan,
    "full": lambda s: policy_full.plan(s, time_limit=0.4, workers=1),
}


def cluster(*jobs: dict[str, Any], gpus: int = 32, per_node: int = 8, horizon: int = 4,
            types: list[str] | None = None, switches: list[str] | None = None) -> Scenario:
    d: dict[str, Any] = {"name": "t", "gpus": gpus, "gpus_per_node": per_node, "horizon": horizon, "jobs": list(jobs)}
    if types:
        d["node_types"] = types
    if switches:
        d["node_switches"] = switches
    return from_dict(d)


def blocks(s: Scenario, grid: Grid) -> dict[str, tuple[int, int]]:
    """Each batch job's (first step, first GPU) in the grid."""
    realtime = {r.id for r in s.realtime}
    out: dict[str, tuple[int, int]] = {}
    for g, row in enumerate(grid):
        for t, cell in enumerate(row):
            if cell is not None and cell not in realtime:
                start, first = out.get(cell, (t, g))
                out[cell] = (min(start, t), min(first, g))
    return out


def assert_keeps_to_masks(s: Scenario, grid: Grid) -> None:
    assert violations(s, grid) == []
    masks = StartMasks(s)
    jobs = {j.id: j for j in s.batch}
    for job_id, (_, first) in blocks(s, grid).items():
        j = jobs[job_id]
        assert j.running or masks.is_allowed(j, first), f"{job_id} at GPU {first}"


# Four nodes of 8: a100, h100, a100, h100; two switches of two nodes each.
TYPES = ["a100", "h100", "a100", "h100"]
SWITCHES = ["s0", "s0", "s1", "s1"]


@pytest.mark.parametrize("name", POLICIES)
def test_typed_jobs_run_only_on_nodes_of_their_type(name: str) -> None:
    s = cluster(batch_job("h1", gpus=1, duration=4, priority=9, gpu_types=["h100"]),
                batch_job("h8", gpus=8, duration=2, priority=8, gpu_types=["h100"]),
                batch_job("a4", gpus=4, duration=3, gpu_types=["a100"]),
                batch_job("any", gpus=8, duration=4, priority=2),
                # No two neighbouring nodes are both a100: this one can never be placed.
                batch_job("a16", gpus=16, duration=1, priority=10, gpu_types=["a100"]),
                types=TYPES, switches=SWITCHES)
    grid = POLICIES[name](s).grid
    assert_keeps_to_masks(s, grid)
    at = blocks(s, grid)
    assert set(at) == {"h1", "h8", "a4", "any"}  # a16 is last in the file: fifo too places the rest
    assert at["h1"][1] // 8 in (1, 3) and at["h8"][1] // 8 in (1, 3) and at["a4"][1] // 8 in (0, 2)


@pytest.mark.parametrize("name", POLICIES)
def test_a_same_switch_gang_stays_under_one_switch(name: str) -> None:
    # Switches of 1, 2 and 1 nodes: both 16-GPU blocks span two switches (nodes 1 and 2
    # share s1, but no aligned block is just them), so the gang can never start.
    s = cluster(batch_job("gang", gpus=16, duration=3, same_switch=True),
                batch_job("small", gpus=2, duration=2), switches=["s0", "s1", "s1", "s2"])
    assert StartMasks(s).allowed(s.batch[0]) == 0
    grid = POLICIES[name](s).grid
    assert_keeps_to_masks(s, grid)
    assert "gang" not in blocks(s, grid)

    s = cluster(batch_job("gang", gpus=16, duration=3, same_switch=True), batch_job("pin", gpus=8, duration=4,
                running={"started": 0, "first_gpu": 16}), switches=["s0", "s1", "s2", "s2"], horizon=6)
    at = blocks(s, POLICIES[name](s).grid)
    assert at["gang"] == (4, 16)  # waits for the one one-switch block rather than span two


def test_fast_gives_a_gang_the_block_under_fewest_switches() -> None:
    # Both 16-GPU blocks are free; without switches fast takes the lowest, [0, 16), which
    # spans s0 and s1. It is not required to stay under one switch, but should when it can.
    switches = ["s0", "s1", "s1", "s1"]
    s = cluster(batch_job("gang", gpus=16, duration=2), switches=switches)
    assert blocks(s, policy_fast.plan(s).grid)["gang"] == (0, 16)
    flat = cluster(batch_job("gang", gpus=16, duration=2))
    assert blocks(flat, policy_fast.plan(flat).grid)["gang"] == (0, 0)
    # No 32-GPU block is under one switch: [0, 32) spans three, [32, 64) two, and wins.
    s = cluster(batch_job("wide", gpus=32, duration=2), gpus=64,
                switches=["a", "b", "c", "c", "d", "d", "e", "e"])
    masks = StartMasks(s)
    assert [masks.switches_spanned(f, 32) for f in (0, 32)] == [3, 2]
    assert blocks(s, policy_fast.plan(s).grid)["wide"] == (0, 32)


def test_a_gang_takes_whole_nodes() -> None:
    s = cluster(batch_job("one", gpus=1, duration=4, priority=9), batch_job("gang", gpus=16, duration=4))
    at = blocks(s, policy_fast.plan(s).grid)
    assert at["gang"][1] % 8 == 0 and at["gang"][1] // 8 != at["one"][1] // 8


# Random clusters: types, switches, gangs. ------------------------------------------------

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def typed_scenarios(draw: st.DrawFn) -> Scenario:
    per_node = draw(st.sampled_from([2, 4]))
    nodes = draw(st.sampled_from([2, 4, 8]))
    gpus = per_node * nodes
    horizon = draw(st.integers(3, 7))
    types = [draw(st.sampled_from(["a", "b"])) for _ in range(nodes)]
    rack = draw(st.integers(1, 3))
    jobs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        demand = draw(st.lists(st.integers(0, per_node), min_size=horizon, max_size=horizon))
        jobs.append(realtime_app("rt0", demand, swap=draw(st.integers(1, 3))))
    for i in range(draw(st.integers(1, 9))):
        size = draw(st.sampled_from([n for n in (1, 2, 4, 8, 16) if n <= gpus]))
        wants = draw(st.sampled_from([[], [], ["a"], ["b"], ["a", "b"]]))
        jobs.append(batch_job(f"j{i}", gpus=size, duration=draw(st.integers(1, horizon + 1)),
                              priority=draw(st.integers(1, 10)), arrival=draw(st.integers(0, horizon - 1)),
                              gpu_types=[t for t in wants if t in types],
                              same_switch=size > per_node and draw(st.booleans())))
    return from_dict({"name": "typed", "gpus": gpus, "gpus_per_node": per_node, "horizon": horizon, "jobs": jobs,
                      "node_types": types, "node_switches": [f"s{n // rack}" for n in range(nodes)]})


@SETTINGS
@given(typed_scenarios())
def test_fifo_fast_and_fair_keep_every_job_to_its_start_masks(s: Scenario) -> None:
    for name in ("fifo", "fast", "fair"):
        assert_keeps_to_masks(s, POLICIES[name](s).grid)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_scenarios())
def test_full_keeps_every_job_to_its_start_masks(s: Scenario) -> None:
    assert_keeps_to_masks(s, policy_full.plan(s, time_limit=0.3, workers=1).grid)


@SETTINGS
@given(typed_scenarios(), st.integers(0, 2))
def test_fast_skipping_under_constraints_places_exactly_what_a_full_search_does(s: Scenario, repeat: int) -> None:
    # A failure also rules out larger jobs of its class: the shortcut must still place
    # exactly what searching for every job places, job by job, under the same masks.
    masks = StartMasks(s)
    copies = [replace(j, id=f"{j.id}-{k}") for k in range(repeat + 1) for j in s.batch if j.running is None]
    base = pinned_board(s)
    policy_fast.place_realtime(base, s.realtime)
    skipping, searching = base.copy(), base.copy()
    policy_fast.place_batch(skipping, s, copies, masks)
    for j in copies:
        spot = policy_fast.earliest_block(searching, j, 0, masks)
        if spot is not None:
            searching.place_block(j.id, spot[1], j.gpus, spot[0], spot[0] + j.duration)
    assert skipping.cells == searching.cells


@SETTINGS
@given(typed_scenarios())
def test_fast_order_keys_sort_as_the_tuples_they_pack(s: Scenario) -> None:
    h = s.horizon

    def reach(j: Any) -> int:
        return max(0, min(j.duration, h - j.arrival))

    tuples: list[Callable[[Any], tuple[int, ...]]] = [
        lambda j: (-j.priority, j.arrival, -j.gpus, -j.duration),
        lambda j: (-j.priority, -j.gpus, j.arrival, -j.duration),
        lambda j: (-j.priority * j.gpus * reach(j), j.arrival),
        lambda j: (-j.gpus, -j.priority, j.arrival),
    ]
    for packed, plain in zip(policy_fast.orders(s), tuples, strict=True):
        assert [j.id for j in sorted(s.batch, key=packed)] == [j.id for j in sorted(s.batch, key=plain)]
