"""The live cluster as a plan: layout, pinning, step-0 decisions and the reasons a job waits."""

from __future__ import annotations

import pytest
from builders import queued, running

from rota.core.planning.legality import violations
from rota.core.planning.liveplan import RESERVED_PREFIX, Horizon, LiveJob, LiveNode, Start, build, decide
from rota.core.planning.planner import plan_live

STEP = 60.0
NOW = 1_000_000 * STEP  # a wall-clock time on a step boundary: step index 1,000,000


def horizon(steps: int = 8, now: float = NOW) -> Horizon:
    return Horizon(STEP, steps, now)


def app(id: str, demand: tuple[int, ...], swap: int = 1, node: str | None = None, gpus: tuple[int, ...] = ()) -> LiveJob:
    return LiveJob(id, "t", "realtime", 9, 0, node=node, gpu_indices=gpus, demand=demand, max_swap=swap)


def test_a_smaller_node_has_the_rest_of_its_slot_reserved_so_nothing_is_planned_there() -> None:
    ls = build([LiveNode("a", 8), LiveNode("b", 6)], [], horizon())
    assert ls.layout.slot == 8 and ls.scenario.gpus == 16
    reserved = sorted(j.running.first_gpu + k for j in ls.scenario.batch if j.id.startswith(RESERVED_PREFIX)
                      for k in range(j.gpus) if j.running)
    assert reserved == [14, 15]
    assert ls.layout.where(14) is None and ls.layout.where(13) == ("b", 5)


def test_a_cluster_of_three_nodes_pads_to_a_power_of_two_slots() -> None:
    ls = build([LiveNode("a", 4), LiveNode("b", 4), LiveNode("c", 4)], [], horizon())
    assert ls.scenario.gpus == 16
    assert [ls.layout.where(g) for g in (0, 4, 8, 12)] == [("a", 0), ("b", 0), ("c", 0), None]


CASES = [
    ("a waiting job starts now on the lowest free aligned block",
     [LiveNode("a", 4)], [queued("j1", gpus=2)], {"j1": Start("j1", "a", (0, 1))}, {}),
    ("a job waits for the block a running job frees, and names it",
     [LiveNode("a", 4)], [running("r1", "a", (0, 1), minutes_left=2), running("r2", "a", (2, 3), None),
                          queued("j1", gpus=2)],
     {}, {"j1": "planned at step 2 (in ~2m), after r1 ends"}),
    ("a job larger than every node is a gang that waits for nodes",
     [LiveNode("a", 4)], [queued("big", gpus=8)], {}, {"big": "needs 2 nodes of 4 GPUs; the live cluster has 1 node with 4 GPUs or more"}),
    ("with no live node every job waits",
     [], [queued("j1")], {}, {"j1": "no live node"}),
    ("a job that fits nowhere in the horizon says so",
     [LiveNode("a", 2)], [running("r1", "a", (0, 1), None), queued("j1", gpus=2)],
     {}, {"j1": "none is free for it within the 8-step plan"}),
    ("higher priority starts first when only one fits",
     [LiveNode("a", 2)], [queued("low", gpus=2, priority=2), queued("high", gpus=2, priority=9)],
     {"high": Start("high", "a", (0, 1))}, {"low": "planned at step 1"}),
    ("blocks never straddle two nodes",
     [LiveNode("a", 2), LiveNode("b", 2)], [running("r1", "a", (1,), None), queued("j1", gpus=2)],
     {"j1": Start("j1", "b", (0, 1))}, {}),
]


@pytest.mark.parametrize(("nodes", "jobs", "starts", "waiting"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_step_zero_decisions(nodes: list[LiveNode], jobs: list[LiveJob], starts: dict[str, Start], waiting: dict[str, str]) -> None:
    out = plan_live(nodes, jobs, horizon(), "fast")
    assert violations(out.live.scenario, out.plan_grid) == []
    assert {s.job_id: s for s in out.decision.starts} == starts
    for job_id, fragment in waiting.items():
        assert fragment in out.decision.waiting[job_id]
    assert not set(starts) & set(out.decision.waiting)


def test_a_realtime_app_keeps_its_gpu_and_grows_by_at_most_the_swap_cap() -> None:
    jobs = [app("chat", (3, 3, 3, 3), swap=1, node="a", gpus=(3,))]
    out = plan_live([LiveNode("a", 4)], jobs, horizon(4), "fast")
    assert out.decision.resizes == [Start("chat", "a", (2, 3))]
    assert violations(out.live.scenario, out.plan_grid) == []


def test_a_realtime_app_sheds_no_more_than_the_cap_when_demand_falls() -> None:
    jobs = [app("chat", (1, 1, 1, 1), swap=1, node="a", gpus=(0, 1, 2, 3))]
    out = plan_live([LiveNode("a", 4)], jobs, horizon(4), "fast")
    assert [len(r.gpus) for r in out.decision.resizes] == [3]


def test_a_new_realtime_app_starts_on_one_node_with_its_demand_now() -> None:
    out = plan_live([LiveNode("a", 4), LiveNode("b", 4)], [app("chat", (2,), swap=4)], horizon(4), "fast")
    (start,) = out.decision.starts
    assert start.job_id == "chat" and len(start.gpus) == 2


def test_demand_curves_are_read_at_the_wall_clock_step() -> None:
    curve = tuple(range(1, 5))  # 1, 2, 3, 4 GPUs, repeating
    ls = build([LiveNode("a", 8)], [app("chat", curve, swap=8)], horizon(3, now=NOW + 2 * STEP))
    # NOW's step index is a multiple of 4, so two steps later the curve is at index 2.
    assert ls.scenario.realtime[0].demand == (3, 4, 1)


def test_a_running_job_past_its_estimate_is_planned_to_end_this_step() -> None:
    ls = build([LiveNode("a", 2)], [running("r1", "a", (0, 1), minutes_left=-5, elapsed_min=10)], horizon())
    (job,) = [j for j in ls.scenario.batch if j.id == "r1"]
    assert job.running is not None and job.running.started + job.duration == 1


def test_figures_count_only_real_gpus() -> None:
    jobs = [running("r1", "a", (0, 1), None)]
    out = plan_live([LiveNode("a", 2), LiveNode("b", 1)], jobs, horizon(), "fast")
    assert out.figures["utilization"] == pytest.approx(2 / 3)


def test_decide_ignores_jobs_on_nodes_that_are_gone() -> None:
    ls = build([LiveNode("a", 2)], [running("r1", "gone", (0,), None)], horizon())
    assert "not live" in ls.excluded["r1"]
    assert decide(ls, [[None] * 8 for _ in range(ls.scenario.gpus)]).waiting["r1"].endswith("not live")


BAD_GPU_CASES = [
    ("a bad GPU is given to no job: the next free blocks are used instead",
     [LiveNode("a", 4, bad_gpus=(0,))], [queued("j1"), queued("j2", gpus=2)],
     {"j1": Start("j1", "a", (1,)), "j2": Start("j2", "a", (2, 3))}, {}),
    ("a job goes to the node whose GPUs are all good",
     [LiveNode("a", 2, bad_gpus=(1,)), LiveNode("b", 2)], [queued("j1", gpus=2)],
     {"j1": Start("j1", "b", (0, 1))}, {}),
    ("a job that needs a whole node waits when every node has a bad GPU, and says so",
     [LiveNode("a", 2, bad_gpus=(0,)), LiveNode("b", 2, bad_gpus=(1,))], [queued("j1", gpus=2)],
     {}, {"j1": "with the GPUs marked bad taken out, the most a live node has is 1"}),
    ("a bad GPU that a running job holds stays with it until it ends",
     [LiveNode("a", 2, bad_gpus=(0,))], [running("r1", "a", (0, 1), minutes_left=2), queued("j1")],
     {}, {"j1": "planned at step 2"}),
    ("once that job has ended, the bad GPU is reserved and the good one is used",
     [LiveNode("a", 2, bad_gpus=(0,))], [queued("j1")],
     {"j1": Start("j1", "a", (1,))}, {}),
    ("a node whose every GPU is bad takes nothing",
     [LiveNode("a", 2, bad_gpus=(0, 1))], [queued("j1")],
     {}, {"j1": "the most a live node has is 0"}),
    ("a bad index the node does not have is ignored",
     [LiveNode("a", 2, bad_gpus=(7,))], [queued("j1", gpus=2)],
     {"j1": Start("j1", "a", (0, 1))}, {}),
]


@pytest.mark.parametrize(("nodes", "jobs", "starts", "waiting"), [c[1:] for c in BAD_GPU_CASES],
                         ids=[c[0] for c in BAD_GPU_CASES])
def test_bad_gpus_stay_out_of_the_plan(nodes: list[LiveNode], jobs: list[LiveJob], starts: dict[str, Start],
                                       waiting: dict[str, str]) -> None:
    for policy in ("fifo", "fast"):
        out = plan_live(nodes, jobs, horizon(), policy)
        assert violations(out.live.scenario, out.plan_grid) == []
        assert {s.job_id: s for s in out.decision.starts} == starts
        for job_id, fragment in waiting.items():
            assert fragment in out.decision.waiting[job_id], (policy, out.decision.waiting[job_id])
        holder = {out.live.layout.flat(j.node, g): j.id for j in jobs if j.node for g in j.gpu_indices}
        for row in {out.live.layout.flat(n.name, g) for n in nodes for g in n.bad_gpus if g < n.gpus}:
            cells = out.plan_grid[row]
            if row in holder:  # the job that runs there keeps it (the plan after it ends reserves it)
                assert cells[0] == holder[row]
            else:  # reserved through the whole horizon
                assert all(c is not None and c.startswith(RESERVED_PREFIX) for c in cells)


def test_a_bad_gpu_is_pinned_as_one_reserved_row_and_counts_out_of_utilisation() -> None:
    ls = build([LiveNode("a", 4, bad_gpus=(2,))], [], horizon())
    [bad] = [j for j in ls.scenario.batch if j.id.startswith(f"{RESERVED_PREFIX}bad-")]
    assert bad.id == f"{RESERVED_PREFIX}bad-a-2" and bad.gpus == 1 and bad.running is not None
    assert bad.running.first_gpu == 2 and bad.duration == ls.scenario.horizon
    out = plan_live([LiveNode("a", 4, bad_gpus=(2,))], [running("r1", "a", (0, 1), None)], horizon(), "fast")
    assert out.figures["utilization"] == pytest.approx(2 / 3)  # 2 of the 3 usable GPUs
