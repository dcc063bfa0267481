"""`rota health` / `rota drain` parsing, and how verdicts read for people."""

from __future__ import annotations

from datetime import UTC, datetime

from rota.cli.detector_commands import devices, evidence_text
from rota.cli.main import HANDLERS, build_parser
from rota.client import Gpu, Node, Verdict


def verdict(**kw: object) -> Verdict:
    base: dict[str, object] = {
        "job_id": "j-1", "rank": 5, "kind": "slow", "iteration": 1204, "ratio": 1.31, "node": "node-1", "gpu": 1,
        "epoch": 4, "at": datetime(2026, 1, 1, tzinfo=UTC),
        "evidence": {"stage": 2, "replica": 0, "rank_ratios": [1.3, 1.32], "tp_peer_ratios": {"4": 1.0}},
    }
    return Verdict(**{**base, **kw})  # type: ignore[arg-type]


def test_health_and_drain_parse_with_their_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["health", "--job", "j-1", "--json"])
    assert (args.command, args.job, args.json, args.limit) == ("health", "j-1", True, 100)
    args = parser.parse_args(["drain", "node-2", "--undo", "--reason", "fan noise"])
    assert (args.node, args.undo, args.reason) == ("node-2", True, "fan noise")
    assert {"health", "drain"} <= set(HANDLERS)


def test_a_verdict_reads_as_one_line_with_where_and_why() -> None:
    assert verdict().summary() == "iteration 1204: rank 5 (stage 2, replica 0) slow: 1.31x its expected time on node-1/1 (epoch 4)"
    stop = verdict(kind="stop", rank=3, gpu=None, ratio=1.2, evidence={"silent_s": 3.6, "timeout_s": 3.0, "why": "quiet"})
    assert stop.summary() == "iteration 1204: rank 3 stop: silent 3.6s (timeout 3s) on node-1 (epoch 4)"
    assert evidence_text(verdict()) == "rank ratios 1.30,1.32; TP peers 4:1.00"
    assert evidence_text(stop) == "quiet"


def test_devices_carry_the_verdicts_that_name_them() -> None:
    gpus = [Gpu(0, "u0", "virtual", True, ""), Gpu(1, "u1", "virtual", True, "j-1")]
    nodes = [Node(name="node-1", address="a", health="ALIVE", gpus=gpus, last_heartbeat=None)]
    out = devices(nodes, [verdict(), verdict(gpu=None)])
    assert [(d["gpu"], d["job_id"], len(d["verdicts"])) for d in out] == [(0, None, 0), (1, "j-1", 1)]
