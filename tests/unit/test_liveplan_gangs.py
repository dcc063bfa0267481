"""Gangs, GPU types and switches in the live plan: layout, exclusions, pins, starts and moves."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import queued, running

from rota.core.fairness.twostage import JobView, TenantState
from rota.core.planning import policies
from rota.core.planning.grid import pinned_board
from rota.core.planning.legality import violations
from rota.core.planning.liveplan import RESERVED_PREFIX, Horizon, LiveJob, LiveNode, Start, build, gang_shape
from rota.core.planning.moves import MoveCost, MoveInputs, pin_targets
from rota.core.planning.planner import FairInputs, plan_live

STEP = 60.0
NOW = 1_000_000 * STEP


def horizon(steps: int = 8) -> Horizon:
    return Horizon(STEP, steps, NOW)


def nodes(*names: str, gpus: int = 2, **fields: str) -> list[LiveNode]:
    return [LiveNode(n, gpus, **fields) for n in names]


def gang_running(id: str, on: tuple[str, ...], gpus: tuple[int, ...] = (0, 1), **fields: object) -> LiveJob:
    """A gang holding `gpus` on each of `on`, 10 minutes left."""
    job = running(id, on[0], gpus, minutes_left=10)
    return replace(job, gpus=len(gpus) * len(on), nodes=len(on), gang_nodes=on, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("job", "slot", "shape"), [
    (queued("one", gpus=2), 4, (1, 2)),
    (queued("whole", gpus=8), 4, (2, 4)),
    (queued("spec", gpus=4, nodes=4, gpus_per_node=1), 4, (4, 1)),
    (queued("spec-whole", gpus=8, nodes=2), 4, (2, 4)),
])
def test_gang_shape(job: LiveJob, slot: int, shape: tuple[int, int]) -> None:
    assert gang_shape(job, slot) == shape


START_CASES = [
    ("a job larger than a node starts on two adjacent whole nodes, in rank order",
     nodes("a", "b", "c", "d"), [running("r", "a", (0,), None), queued("g", gpus=4)],
     {"g": Start("g", "c", (0, 1), ("c", "d"))}),
    ("a gang named by nodes x GPUs per node starts with per-node indices 0..m-1",
     nodes("a", "b"), [queued("g", gpus=2, nodes=2, gpus_per_node=1)],
     {"g": Start("g", "a", (0,), ("a", "b"))}),
    ("a gang goes to the nodes of its GPU type only",
     [LiveNode("a", 2, gpu_type="a100"), LiveNode("b", 2, gpu_type="a100"),
      LiveNode("c", 2, gpu_type="h100"), LiveNode("d", 2, gpu_type="h100")],
     [queued("g", gpus=4, gpu_types=("h100",))], {"g": Start("g", "c", (0, 1), ("c", "d"))}),
    ("nodes stack by switch, so a same-switch gang finds two nodes whose names interleave",
     [LiveNode("n1", 2, switch="s1"), LiveNode("n2", 2, switch="s2"), LiveNode("n3", 2, switch="s1"),
      LiveNode("n4", 2, switch="s2")],
     [queued("g", gpus=4, same_switch=True)], {"g": Start("g", "n1", (0, 1), ("n1", "n3"))}),
    ("a typed single-node job goes to a node of its type though a lower one is free",
     [LiveNode("a", 2, gpu_type="a100"), LiveNode("b", 2, gpu_type="h100")],
     [queued("j", gpus=1, gpu_types=("h100",))], {"j": Start("j", "b", (0,))}),
    ("a single-node job has no node list",
     nodes("a", "b"), [queued("j", gpus=2)], {"j": Start("j", "a", (0, 1))}),
]


@pytest.mark.parametrize(("live", "jobs", "starts"), [c[1:] for c in START_CASES], ids=[c[0] for c in START_CASES])
def test_gang_starts(live: list[LiveNode], jobs: list[LiveJob], starts: dict[str, Start]) -> None:
    out = plan_live(live, jobs, horizon(), "fast")
    assert violations(out.live.scenario, out.plan_grid) == []
    assert {s.job_id: s for s in out.decision.starts if s.job_id in starts} == starts


def test_the_fast_policy_keeps_typed_jobs_on_their_types() -> None:
    live = [LiveNode(n, 2, gpu_type=t) for n, t in zip("abcd", ["a100", "h100", "a100", "h100"], strict=True)]
    jobs = [queued(f"h{i}", gpus=g, gpu_types=("h100",)) for i, g in enumerate([2, 1, 1])]
    jobs += [queued(f"a{i}", gpus=2, gpu_types=("a100",)) for i in range(3)] + [queued("untyped", gpus=2)]
    ls = build(live, jobs, horizon())
    grid = policies.get("fast")(ls.scenario).grid
    assert violations(ls.scenario, grid) == []
    types = {n.name: n.gpu_type for n in live}
    for g, row in enumerate(grid):
        where = ls.layout.where(g)
        for cell in row:
            if cell and cell[0] in "ha" and where:
                assert types[where[0]] == {"h": "h100", "a": "a100"}[cell[0]], (cell, where)


def test_a_gang_with_fewer_ranks_than_gpus_still_holds_its_nodes_whole() -> None:
    out = plan_live(nodes("a", "b", "c", "d"), [queued("g", gpus=2, nodes=2, gpus_per_node=1),
                                                queued("j", gpus=1)], horizon(), "fast")
    rows = [g for g, row in enumerate(out.plan_grid) if row[0] == "g"]
    assert len(rows) == 4  # two whole nodes of 2 GPUs, not two GPUs
    (j,) = [s for s in out.decision.starts if s.job_id == "j"]
    assert j.node in ("c", "d")


WAIT_CASES = [
    ("a gang larger than the cluster waits, naming what it needs and what there is",
     nodes("a", "b", "c"), queued("g", gpus=2, nodes=4, gpus_per_node=2),
     "waiting: needs 4 nodes of 2 GPUs; the live cluster has 3 nodes with 2 GPUs or more"),
    ("no live node has the GPU type it accepts",
     nodes("a", gpu_type="a100"), queued("j", gpus=1, gpu_types=("h100",)),
     "waiting: needs GPUs of type h100; no live node has them"),
    ("a node of its type exists, but not enough of them for the gang",
     [LiveNode("a", 2, gpu_type="a100"), LiveNode("b", 2, gpu_type="h100")], queued("g", gpus=4, gpu_types=("h100",)),
     "waiting: needs 2 nodes of 2 GPUs of type h100; the live cluster has 1 node of type h100 with 2 GPUs or more"),
    ("a single-node job of a type whose nodes are too small",
     [LiveNode("a", 4, gpu_type="a100"), LiveNode("b", 2, gpu_type="h100")], queued("j", gpus=4, gpu_types=("h100",)),
     "waiting: needs 4 GPUs on one node of type h100; the largest such node has 2"),
    ("a same-switch gang when no switch has enough nodes",
     [*nodes("a", "b", "c", switch="s1"), *nodes("d", switch="s2")], queued("g", gpus=8, same_switch=True),
     "waiting: needs 4 nodes under one switch; best now 3"),
    ("a node of unknown switch never counts as under another node's switch",
     [LiveNode("a", 2, switch="s1"), LiveNode("b", 2)], queued("g", gpus=4, same_switch=True),
     "waiting: needs 2 nodes under one switch; best now 1"),
    ("a node with a bad GPU cannot be one of a gang's whole nodes",
     [LiveNode("a", 2), LiveNode("b", 2, bad_gpus=(1,))], queued("g", gpus=4),
     "with the GPUs marked bad taken out, 1 node have all 2"),
    ("a gang takes whole nodes of the slot size: smaller nodes do not count",
     [LiveNode("a", 4), LiveNode("b", 2), LiveNode("c", 2)], queued("g", gpus=2, nodes=2, gpus_per_node=1),
     "the live cluster has 1 node with 4 GPUs or more; a gang holds whole nodes"),
    ("a gang waiting for busy nodes says when, in nodes",
     nodes("a", "b"), queued("g", gpus=4),
     "waiting: needs 2 nodes x 2 GPUs (an aligned 4-GPU block of whole nodes); planned at step 2 (in ~2m), after r ends"),
]


@pytest.mark.parametrize(("live", "job", "reason"), [c[1:] for c in WAIT_CASES], ids=[c[0] for c in WAIT_CASES])
def test_gangs_and_typed_jobs_wait_with_a_reason(live: list[LiveNode], job: LiveJob, reason: str) -> None:
    others = [running("r", "a", (0,), minutes_left=2)] if "busy" in reason or "after r" in reason else []
    out = plan_live(live, [*others, job], horizon(), "fast")
    assert violations(out.live.scenario, out.plan_grid) == []
    assert job.id not in {s.job_id for s in out.decision.starts}
    assert reason in out.decision.waiting[job.id]


def test_an_excluded_gang_is_held_not_planned() -> None:
    ls = build(nodes("a"), [queued("g", gpus=4)], horizon())
    assert "g" in ls.excluded and "g" not in {j.id for j in ls.scenario.batch}


def test_the_scenario_carries_types_and_switches_per_slot_with_padding_of_its_own() -> None:
    live = [LiveNode("b", 2, gpu_type="h100", switch="s2"), LiveNode("a", 2, gpu_type="a100", switch="s1"),
            LiveNode("c", 2, switch="s1")]
    ls = build(live, [queued("j", gpus=1, gpu_types=("h100",), same_switch=True)], horizon())
    assert [n.name for n in ls.layout.nodes] == ["a", "c", "b"]
    assert ls.scenario.node_types == ("a100", "", "h100", "")
    assert ls.scenario.node_switches[:3] == ("s1", "s1", "s2")
    assert ls.scenario.node_switches[3] not in ls.scenario.node_switches[:3]
    (j,) = [b for b in ls.scenario.batch if b.id == "j"]
    assert j.gpu_types == frozenset({"h100"}) and j.same_switch


def test_an_untyped_cluster_models_neither_types_nor_switches() -> None:
    ls = build(nodes("a", "b"), [], horizon())
    assert ls.scenario.node_types == () and ls.scenario.node_switches == ()


PIN_CASES = [
    ("a gang on one aligned block of whole nodes is one pinned block",
     nodes("a", "b", "c", "d"), gang_running("g", ("c", "d")), [(4, 4)], 0),
    ("a gang on nodes that are no aligned block is pinned row by row",
     nodes("a", "b", "c", "d"), gang_running("g", ("b", "c")), [], 4),
    ("a gang using one GPU per node still holds every GPU of its nodes",
     nodes("a", "b"), gang_running("g", ("a", "b"), (0,)), [(0, 4)], 0),
]


@pytest.mark.parametrize(("live", "gang", "blocks", "rows"), [c[1:] for c in PIN_CASES], ids=[c[0] for c in PIN_CASES])
def test_a_running_gang_is_pinned_on_all_its_nodes(live: list[LiveNode], gang: LiveJob, blocks: list[tuple[int, int]],
                                                  rows: int) -> None:
    ls = build(live, [gang], horizon())
    pinned = [(b.running.first_gpu, b.gpus) for b in ls.scenario.batch if b.id == gang.id and b.running]
    singles = [b for b in ls.scenario.batch if b.id.startswith(f"{RESERVED_PREFIX}{gang.id}-")]
    assert pinned == blocks and len(singles) == rows
    out = plan_live(live, [gang, queued("j", gpus=2)], horizon(), "fast")
    held = {out.live.layout.flat(n, g) for n in gang.gang_nodes for g in range(2)}
    assert all(out.plan_grid[g][0] not in (None, "j") for g in held)


def test_a_running_gang_keeps_its_live_nodes_when_one_is_gone() -> None:
    ls = build(nodes("a", "b"), [gang_running("g", ("a", "gone"))], horizon())
    assert "g" not in ls.excluded
    grid = pinned_board(ls.scenario).cells
    assert [g for g, row in enumerate(grid) if row[0] and row[0].lstrip(RESERVED_PREFIX).startswith("g")] == [0, 1]
    gone = build(nodes("a"), [gang_running("g", ("x", "y"))], horizon())
    assert gone.excluded["g"] == "holds GPUs on x, y, which are not live"


def test_a_bad_gpu_on_a_running_gangs_node_is_left_to_the_gang() -> None:
    ls = build([LiveNode("a", 2, bad_gpus=(1,)), LiveNode("b", 2)], [gang_running("g", ("a", "b"), (0,))], horizon())
    assert not [b for b in ls.scenario.batch if b.id.startswith(f"{RESERVED_PREFIX}bad-")]


# Moves never touch a gang.
CHEAP = MoveCost(pause_s=2.0, restore_s=3.0)


def test_a_gang_is_never_preempted_even_when_pausing_it_would_pay() -> None:
    gang = gang_running("g", ("a", "b"), preemptible=True, priority=1)
    jobs = [gang, queued("high", gpus=4, priority=9)]
    out = plan_live(nodes("a", "b"), jobs, horizon(), "fast", moves=MoveInputs(costs={"g": CHEAP}))
    assert out.preemption is None
    single = [running("low", "a", (0, 1), preemptible=True, priority=1), queued("high", gpus=2, priority=9)]
    control = plan_live(nodes("a"), single, horizon(), "fast", moves=MoveInputs(costs={"low": CHEAP}))
    assert control.preemption is not None  # the same move of a single-node job is made


def test_a_gang_is_never_migrated_to_repair_fragmentation() -> None:
    # Node pair a+b is held by a gang using one GPU of each; a 2-GPU job waits behind it.
    gang = gang_running("g", ("a", "b"), (0,), preemptible=True, priority=1)
    jobs = [gang, queued("wide", gpus=2, priority=9)]
    out = plan_live(nodes("a", "b"), jobs, horizon(), "fast", moves=MoveInputs(costs={"g": CHEAP}))
    assert out.migrations == [] and out.preemption is None


def test_a_resume_target_is_ignored_for_a_gang() -> None:
    jobs = [queued("g", gpus=4), queued("j", gpus=1)]
    placed, starts, waiting = pin_targets(nodes("a", "b"), jobs, {"g": "a", "j": "a"})
    assert [s.job_id for s in starts] == ["j"] and waiting == {}
    assert next(j for j in placed if j.id == "g").node is None


def test_a_running_gangs_nodes_count_as_used_for_resume_targets() -> None:
    jobs = [gang_running("g", ("a", "b"), (0,)), queued("j", gpus=1)]
    _, starts, waiting = pin_targets(nodes("a", "b"), jobs, {"j": "b"})
    assert starts == [] and "asked to run on b" in waiting["j"]


def test_a_waiting_gang_takes_yields_freed_on_several_nodes() -> None:
    lease_s = 1800.0
    hogs = [replace(running(f"h{i}", n, (0, 1), elapsed_min=10 * lease_s / 60, tenant="hog"), preemptible=True,
                    restart="on-failure") for i, n in enumerate("ab")]
    tenants = {"hog": TenantState("hog", 1, 4, 0.0, 0.0), "poor": TenantState("poor", 4, 0, 0.0, 0.0)}

    def yields(waiting: LiveJob) -> list[str]:
        view = JobView(waiting.id, "poor", waiting.gpus, NOW - 60, 0.0, 100.0, NOW - 60)
        fair = FairInputs(tenants, {waiting.id: view})
        out = plan_live(nodes("a", "b"), [*hogs, waiting], horizon(), "fair", fair=fair)
        return sorted(y.job_id for y in out.yields)

    assert yields(queued("g", gpus=4, tenant="poor")) == ["h0", "h1"]
    # A single-node job cannot use two GPUs freed on two nodes.
    assert yields(queued("j", gpus=2, tenant="poor", nodes=1)) == ["h0"]
