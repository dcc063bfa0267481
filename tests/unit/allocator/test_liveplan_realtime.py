"""Realtime apps across nodes: one GPU per replica, on any node, as per-node starts and resizes."""

from __future__ import annotations

import pytest

from rota.core.planning.legality import violations
from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode, Start
from rota.core.planning.planner import plan_live

STEP = 60.0
NOW = 1_000_000 * STEP


def app(demand: int, swap: int = 8, on: dict[str, tuple[int, ...]] | None = None,
        types: tuple[str, ...] = ()) -> LiveJob:
    """App `chat` wanting `demand` GPUs at every step, placed as `on` (node -> GPUs; home first)."""
    on = on or {}
    home = next(iter(on), None)
    return LiveJob("chat", "t", "realtime", 9, 0, node=home, gpu_indices=on.get(home, ()) if home else (),
                   demand=(demand,), max_swap=swap, replicas=tuple(on.items()), gpu_types=types)


A2, B2, C2 = LiveNode("a", 2), LiveNode("b", 2), LiveNode("c", 2)

CASES = [
    ("a new app larger than a node starts on two, home where most of its replicas are",
     [A2, B2], app(3), [Start("chat", "b", (0, 1), replicas=(("b", (0, 1)), ("a", (1,))))], []),
    ("a running app grows past its node onto a node with free GPUs",
     [A2, B2], app(4, on={"a": (0, 1)}), [], [Start("chat", "b", (0, 1))]),
    ("it grows on the node it runs on while that has room (the highest free GPUs)",
     [LiveNode("a", 4), LiveNode("b", 4)], app(3, on={"b": (3,)}), [], [Start("chat", "b", (1, 2, 3))]),
    ("the replicas it holds stay where they are",
     [A2, B2], app(2, on={"a": (1,), "b": (0,)}), [], []),
    ("shrinking empties its emptiest node first",
     [A2, B2], app(2, on={"a": (0, 1), "b": (1,)}), [], [Start("chat", "b", ())]),
    ("shrinking within a node keeps that node",
     [A2, B2], app(3, on={"a": (0, 1), "b": (0, 1)}), [], [Start("chat", "a", (1,))]),
    ("a lost node's replicas are placed again on a live node, and the node is left",
     [A2, C2], app(4, on={"a": (0, 1), "b": (0, 1)}), [], [Start("chat", "c", (0, 1)), Start("chat", "b", ())]),
    ("growth stays within max_swap",
     [A2, B2], app(4, swap=1, on={"a": (0, 1)}), [], [Start("chat", "b", (1,))]),
    ("only nodes of its GPU types, and no more than they have",
     [LiveNode("a", 2, gpu_type="a100"), LiveNode("b", 2, gpu_type="h100")], app(4, types=("h100",)),
     [Start("chat", "b", (0, 1))], []),
    ("never on a GPU marked bad",
     [LiveNode("a", 2, bad_gpus=(1,)), B2], app(3), [Start("chat", "b", (0, 1), replicas=(("b", (0, 1)), ("a", (0,))))],
     []),
]


@pytest.mark.parametrize(("nodes", "job", "starts", "resizes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("policy", ["fast", "fair"])
def test_realtime_decisions(nodes: list[LiveNode], job: LiveJob, starts: list[Start], resizes: list[Start],
                            policy: str) -> None:
    out = plan_live(nodes, [job], Horizon(STEP, 4, NOW), policy)
    assert violations(out.live.scenario, out.plan_grid) == []
    assert out.decision.starts == starts
    assert out.decision.resizes == resizes


def test_fifo_reserves_the_peak_across_nodes() -> None:
    out = plan_live([A2, B2, C2], [app(5)], Horizon(STEP, 4, NOW), "fifo")
    assert violations(out.live.scenario, out.plan_grid) == []
    assert sum(len(g) for g in out.decision.replica_sets["chat"].values()) == 5


def test_full_keeps_replicas_on_their_types_and_meets_demand_across_nodes() -> None:
    nodes = [LiveNode("a", 2, gpu_type="h100"), LiveNode("b", 2, gpu_type="a100"), LiveNode("c", 2, gpu_type="h100")]
    out = plan_live(nodes, [app(4, types=("h100",))], Horizon(STEP, 3, NOW), "full", full_time_limit_s=2.0)
    assert violations(out.live.scenario, out.plan_grid) == []
    assert out.decision.replica_sets["chat"] == {"a": (0, 1), "c": (0, 1)}


def test_held_gpus_and_nodes_count_every_node_of_an_app() -> None:
    job = app(3, on={"a": (0, 1), "b": (1,)})
    assert job.held_gpus == 3 and job.holding_nodes == ("a", "b")
    assert job.replica_sets == {"a": (0, 1), "b": (1,)}
    single = LiveJob("s", "t", "realtime", 9, 0, node="a", gpu_indices=(2,), demand=(1,))
    assert single.replica_sets == {"a": (2,)} and single.held_gpus == 1
