"""Moving started jobs: resume targets, priced preemption and fragmentation repair (pure)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import builders
import pytest

from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode, Start
from rota.core.planning.moves import MoveCost, MoveInputs, pin_targets
from rota.core.planning.planner import plan_live

STEP = 60.0
NOW = 1_000_000 * STEP


def horizon(steps: int = 8) -> Horizon:
    return Horizon(STEP, steps, NOW)


# This file's jobs: queued ones declared to run 4 minutes; running ones preemptible, at
# priority 1, with 10 minutes left (each call may say otherwise).
queued = partial(builders.queued, minutes=4)
running = partial(builders.running, minutes_left=10, priority=1, preemptible=True)


CHEAP = MoveCost(pause_s=2.0, restore_s=3.0)


def costs(*ids: str, cost: MoveCost = CHEAP) -> dict[str, MoveCost]:
    return {i: cost for i in ids}


# 1. Resume targets.
PIN_CASES = [
    ("a job resumed to a node starts there even when another node is emptier",
     [LiveNode("a", 4), LiveNode("b", 4)], [running("r", "a", (0,)), queued("j", gpus=2)], {"j": "a"},
     [Start("j", "a", (2, 3))], {}),
    ("a job resumed to a full node waits there, saying what it asked for",
     [LiveNode("a", 2), LiveNode("b", 4)], [running("r", "a", (0, 1)), queued("j", gpus=2)], {"j": "a"},
     [], {"j": "asked to run on a"}),
    ("a pinned job never lands on a GPU marked bad",
     [LiveNode("a", 4, bad_gpus=(0,))], [queued("j", gpus=1)], {"j": "a"}, [Start("j", "a", (1,))], {}),
    ("a target that is not a live node is ignored: the policy places the job anywhere",
     [LiveNode("a", 4)], [queued("j", gpus=2)], {"j": "gone"}, [], {}),
    ("a pinned job takes the block in the most used neighbourhood, keeping larger blocks whole",
     [LiveNode("a", 8)], [running("r", "a", (4,)), queued("j", gpus=1)], {"j": "a"},
     [Start("j", "a", (5,))], {}),
]


@pytest.mark.parametrize("name,nodes,jobs,targets,starts,waiting", PIN_CASES, ids=[c[0] for c in PIN_CASES])
def test_resume_targets(name: str, nodes: list[LiveNode], jobs: list[LiveJob], targets: dict[str, str],
                        starts: list[Start], waiting: dict[str, str]) -> None:
    placed, got, why = pin_targets(nodes, jobs, targets)
    assert got == starts
    assert why.keys() == waiting.keys()
    for job_id, words in waiting.items():
        assert words in why[job_id]
    for start in got:
        pinned = next(j for j in placed if j.id == start.job_id)
        assert (pinned.node, pinned.gpu_indices) == (start.node, start.gpus)


def test_a_pinned_start_is_part_of_the_decision_and_the_policy_plans_around_it() -> None:
    jobs = [queued("pinned", gpus=2), queued("other", gpus=2)]
    out = plan_live([LiveNode("a", 4)], jobs, horizon(), "fast", moves=MoveInputs(targets={"pinned": "a"}))
    starts = {s.job_id: s for s in out.decision.starts}
    assert starts["pinned"] == Start("pinned", "a", (0, 1))
    assert starts["other"].gpus == (2, 3)


def test_a_job_asked_to_a_full_node_waits_even_when_another_node_is_free() -> None:
    jobs = [running("r", "a", (0, 1)), queued("j", gpus=2)]
    out = plan_live([LiveNode("a", 2), LiveNode("b", 4)], jobs, horizon(), "fast", moves=MoveInputs(targets={"j": "a"}))
    assert out.decision.starts == []
    assert "asked to run on a" in out.decision.waiting["j"]


# 2. Priced preemption.
def full_node(victim_priority: int = 1, preemptible: bool = True) -> list[LiveJob]:
    return [running("low", "a", (0, 1, 2, 3), priority=victim_priority, preemptible=preemptible),
            queued("high", gpus=4, priority=9)]


PREEMPT_CASES: list[tuple[str, list[LiveJob], MoveInputs, str, str | None]] = [
    ("a preemptible low-priority job is paused for a high-priority one that takes its GPUs",
     full_node(), MoveInputs(costs=costs("low")), "fast", "low"),
    ("the full policy prices it the same way",
     full_node(), MoveInputs(costs=costs("low")), "full", "low"),
    ("a job that did not declare preemptible is never paused",
     full_node(preemptible=False), MoveInputs(costs=costs("low")), "fast", None),
    ("a job with no measured cost (it has no image) is never paused",
     full_node(), MoveInputs(), "fast", None),
    ("a job already being moved is not paused again",
     full_node(), MoveInputs(costs=costs("low"), busy=frozenset({"low"})), "fast", None),
    ("a job of the same priority is not paused: nothing of higher value waits",
     full_node(victim_priority=9), MoveInputs(costs=costs("low")), "fast", None),
    ("a move that costs more than the plan gains is not made",
     full_node(), MoveInputs(costs=costs("low", cost=MoveCost(1e6, 1e6))), "fast", None),
    ("the FIFO baseline never preempts",
     full_node(), MoveInputs(costs=costs("low")), "fifo", None),
]


@pytest.mark.parametrize("name,jobs,moves,policy,victim", PREEMPT_CASES, ids=[c[0] for c in PREEMPT_CASES])
def test_priced_preemption(name: str, jobs: list[LiveJob], moves: MoveInputs, policy: str, victim: str | None) -> None:
    out = plan_live([LiveNode("a", 4)], jobs, horizon(), policy, full_time_limit_s=2.0, moves=moves)
    got = out.preemption.job_id if out.preemption else None
    assert got == victim
    if out.preemption is not None:
        assert out.preemption.for_job == "high"
        assert out.preemption.gain > out.preemption.cost > 0
        assert "high" in out.preemption.reason


def test_the_cost_is_priority_times_gpus_times_the_move_over_the_step() -> None:
    out = plan_live([LiveNode("a", 4)], full_node(victim_priority=2), horizon(), "fast",
                    moves=MoveInputs(costs=costs("low")))
    assert out.preemption is not None
    assert out.preemption.cost == pytest.approx(2 * 4 * CHEAP.seconds / STEP)


def test_the_cheapest_sufficient_victim_is_chosen_among_several() -> None:
    jobs = [running("a1", "a", (0, 1), priority=3), running("a2", "a", (2, 3), priority=1),
            queued("high", gpus=2, priority=9)]
    out = plan_live([LiveNode("a", 4)], jobs, horizon(), "fast", moves=MoveInputs(costs=costs("a1", "a2")))
    assert out.preemption is not None and out.preemption.job_id == "a2"


def test_a_job_waiting_for_a_block_that_frees_soon_does_not_preempt_when_the_wait_is_cheap() -> None:
    # The victim ends in one step: pausing it for a job that waits one step gains less than it costs.
    jobs = [running("low", "a", (0, 1, 2, 3), minutes_left=1, priority=4), queued("high", gpus=4, priority=5)]
    expensive = MoveCost(pause_s=40.0, restore_s=40.0)
    out = plan_live([LiveNode("a", 4)], jobs, horizon(), "fast", moves=MoveInputs(costs=costs("low", cost=expensive)))
    assert out.preemption is None


# 3. Fragmentation repair.
def fragmented() -> list[LiveJob]:
    # Node a: one GPU used in each half, so no aligned 4-GPU block; node b has a free pair.
    return [running("x", "a", (1,), priority=2), running("y", "a", (4, 5), priority=2),
            running("z", "b", (0, 1), priority=2, preemptible=False), queued("wide", gpus=4, priority=5)]


def test_a_job_needing_an_aligned_block_gets_one_by_moving_a_small_job() -> None:
    out = plan_live([LiveNode("a", 8), LiveNode("b", 4)], fragmented(), horizon(), "fast",
                    moves=MoveInputs(costs=costs("x", "y")))
    assert out.preemption is None
    assert [(m.job_id, m.for_job) for m in out.migrations] == [("x", "wide")]
    assert out.migrations[0].to_node in ("a", "b")
    assert out.migrations[0].cost < out.migrations[0].gain


def test_nothing_moves_when_the_occupants_cannot_be_paused() -> None:
    out = plan_live([LiveNode("a", 8), LiveNode("b", 4)], fragmented(), horizon(), "fast", moves=MoveInputs())
    assert out.migrations == []


def test_nothing_moves_when_there_is_no_room_elsewhere_for_the_occupant() -> None:
    jobs = [replace(j, preemptible=True) if j.id == "z" else j for j in fragmented()]
    jobs = [*jobs, running("w", "b", (2, 3), priority=2, preemptible=False)]
    full_elsewhere = [running("v", "a", (6, 7), priority=2, preemptible=False), *jobs]
    out = plan_live([LiveNode("a", 8), LiveNode("b", 4)], full_elsewhere, horizon(), "fast",
                    moves=MoveInputs(costs=costs("x", "y")))
    # x fits at a:2 or a:3, which lie in the block it would free; y's block holds no free pair.
    assert all(m.job_id != "x" or m.to_node != "a" for m in out.migrations)


def test_the_moves_benchmark_moves_nothing_without_moves_and_serves_high_priority_sooner_with_them() -> None:
    from rota.bench import moves as movesbench

    jobs = movesbench.workload(seed=7, steps=60)
    base, moved = (movesbench.figures(movesbench.simulate(jobs, 60, m), 60) for m in (False, True))
    assert base["preemptions"] == base["migrations"] == base["moved_gpu_seconds"] == 0
    assert moved["preemptions"] > 0
    assert moved["high"]["mean_wait_steps"] < base["high"]["mean_wait_steps"]
