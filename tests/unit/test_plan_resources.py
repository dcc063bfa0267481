"""CPUs and memory in the plan (pure, table-driven): a job is not started on a node that
lacks the CPUs or memory it asks for beside what the node's jobs hold, waits with the
reason, and a job no node could ever hold is kept out of the plan."""

from __future__ import annotations

import pytest

from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode, Start, StepDecision
from rota.core.planning.planner import plan_live
from rota.core.planning.resources import Use, hold_unfit, in_use, shortfall, unfit_anywhere

GI = 2**30


def node(name: str, cpus: float = 8.0, memory_gib: int = 32, gpus: int = 4) -> LiveNode:
    return LiveNode(name, gpus, cpus=cpus, memory_bytes=memory_gib * GI)


def job(job_id: str, cpus: float = 0.0, memory_gib: float = 0, node_name: str | None = None, gpus: int = 1,
        indices: tuple[int, ...] = ()) -> LiveJob:
    return LiveJob(job_id, "t", "training", 5, gpus, node=node_name, gpu_indices=indices or ((0,) if node_name else ()),
                   duration_s=600.0, cpus=cpus, memory_bytes=int(memory_gib * GI))


@pytest.mark.parametrize(("capacity", "used", "ask", "lacks"), [
    (node("n1"), Use(), Use(8.0, 32 * GI), None),  # exactly full fits
    (node("n1"), Use(4.0, 0), Use(5.0, 0), "needs 5 CPUs (4 of 8 free) on n1"),
    (node("n1"), Use(0, 30 * GI), Use(0, 4 * GI), "needs 4 GiB of memory (2 GiB of 32 GiB free) on n1"),
    (node("n1"), Use(8.0, 32 * GI), Use(1.0, GI), "needs 1 CPUs (0 of 8 free) and 1 GiB of memory (0 B of 32 GiB free) on n1"),
    (node("n1", cpus=0, memory_gib=0), Use(100.0, 100 * GI), Use(64.0, 64 * GI), None),  # not reported: not checked
    (node("n1"), Use(8.0, 32 * GI), Use(), None),  # a job that asks nothing always fits
])
def test_shortfall(capacity: LiveNode, used: Use, ask: Use, lacks: str | None) -> None:
    assert shortfall(capacity, used, ask) == lacks


def test_in_use_counts_each_node_a_job_holds() -> None:
    gang = LiveJob("g", "t", "training", 5, 8, node="n1", gpu_indices=(0, 1, 2, 3), gang_nodes=("n1", "n2"),
                   nodes=2, gpus_per_node=4, cpus=2.0, memory_bytes=GI)
    assert in_use([gang, job("a", 1.0, 1, "n1"), job("w", 1.0, 1)]) == {"n1": Use(3.0, 2 * GI), "n2": Use(2.0, GI)}


@pytest.mark.parametrize(("starts", "holding", "kept", "waits"), [
    # Two starts on n1: the second finds only what the first left.
    ([("a", "n1", 6.0, 16), ("b", "n1", 4.0, 8)], [], ["a"], {"b": "waiting: needs 4 CPUs (2 of 8 free) on n1"}),
    # A job already holding n1's memory leaves too little for the start.
    ([("a", "n1", 1.0, 8)], [("r", "n1", 1.0, 30)], [], {"a": "waiting: needs 8 GiB of memory (2 GiB of 32 GiB free) on n1"}),
    # The same start on another node fits.
    ([("a", "n2", 1.0, 8)], [("r", "n1", 1.0, 30)], ["a"], {}),
    # Jobs asking for nothing are never held.
    ([("a", "n1", 0.0, 0), ("b", "n1", 0.0, 0)], [("r", "n1", 8.0, 32)], ["a", "b"], {}),
])
def test_hold_unfit(starts: list[tuple[str, str, float, int]], holding: list[tuple[str, str, float, int]],
                    kept: list[str], waits: dict[str, str]) -> None:
    nodes = [node("n1"), node("n2")]
    jobs = {j: job(j, c, m) for j, _, c, m in starts}
    jobs.update({j: job(j, c, m, n) for j, n, c, m in holding})
    decision = StepDecision(starts=[Start(j, n, (i,)) for i, (j, n, _, _) in enumerate(starts)])
    held = hold_unfit(nodes, jobs, decision)
    assert [s.job_id for s in decision.starts] == kept
    assert decision.waiting == waits and held == list(waits)


def test_a_start_pinned_to_its_node_is_counted_once() -> None:
    """A resumed job pinned to its target holds the node in the job list and starts there."""
    jobs = {"p": job("p", 6.0, 16, "n1")}
    decision = StepDecision(starts=[Start("p", "n1", (0,))])
    assert hold_unfit([node("n1")], jobs, decision) == [] and len(decision.starts) == 1


def test_a_gang_start_needs_room_on_every_node() -> None:
    gang = LiveJob("g", "t", "training", 5, 8, nodes=2, gpus_per_node=4, cpus=4.0)
    jobs = {"g": gang, "r": job("r", 6.0, 0, "n2")}
    decision = StepDecision(starts=[Start("g", "n1", (0, 1, 2, 3), nodes=("n1", "n2"))])
    hold_unfit([node("n1"), node("n2")], jobs, decision)
    assert decision.starts == [] and decision.waiting["g"] == "waiting: needs 4 CPUs (2 of 8 free) on n2"


@pytest.mark.parametrize(("asks", "reason"), [
    ((4.0, 8), None),
    ((16.0, 0), "waiting: no live node has the CPUs or memory it asks for (needs 16 CPUs (8 of 8 free) on n1)"),
    ((0.0, 64), "waiting: no live node has the CPUs or memory it asks for (needs 64 GiB of memory (32 GiB of 32 GiB free) on n1)"),
])
def test_unfit_anywhere(asks: tuple[float, int], reason: str | None) -> None:
    found = unfit_anywhere([node("n1"), node("n2", cpus=4, memory_gib=16)], [job("w", *asks), job("r", 99.0, 0, "n1")])
    assert found == ({"w": reason} if reason else {})


@pytest.mark.parametrize("policy", ["fast", "fifo"])
def test_the_plan_starts_what_fits_and_says_why_the_rest_waits(policy: str) -> None:
    """Two free GPUs on one node but memory for one of the two jobs: one starts, the other
    waits with the reason; a third that no node could hold is kept out of the plan."""
    nodes = [LiveNode("n1", 2, cpus=4.0, memory_bytes=8 * GI)]
    jobs = [job("a", 1.0, 6), job("b", 1.0, 6), job("huge", 1.0, 64)]
    outcome = plan_live(nodes, jobs, Horizon(60.0, 8, 1_000_000.0), policy)
    assert [s.job_id for s in outcome.decision.starts] == ["a"]
    assert outcome.decision.waiting["b"] == "waiting: needs 6 GiB of memory (2 GiB of 8 GiB free) on n1"
    assert outcome.decision.waiting["huge"].startswith("waiting: no live node has the CPUs or memory")
