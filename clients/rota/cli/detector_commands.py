"""`rota health` and `rota drain`: the failure detector from the command line (SPEC §7).

    rota health [--job ID] [--limit N] [--json]   nodes, devices and verdicts with their evidence
    rota drain NODE [--undo] [--reason TEXT]      place nothing new on NODE; running jobs go on
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rota.cli.commands import connect
from rota.cli.output import ago, print_json, table
from rota.client import Node, Verdict

Handler = Callable[[argparse.Namespace], int]


def add_parsers(sub: Any, connection_args: Callable[[argparse.ArgumentParser], None], handlers: dict[str, Handler]) -> None:
    health_p = sub.add_parser("health", help="nodes, devices and the failure detector's verdicts with their evidence")
    health_p.add_argument("--job", default="", help="only this job's verdicts")
    health_p.add_argument("--limit", type=int, default=100, help="at most this many verdicts (newest first)")
    connection_args(health_p)
    drain_p = sub.add_parser("drain", help="place nothing new on a node (admin); running jobs go on")
    drain_p.add_argument("node")
    drain_p.add_argument("--undo", action="store_true", help="take new jobs again")
    drain_p.add_argument("--reason", default="", help="why (logged by the detector)")
    connection_args(drain_p)
    handlers.update({"health": health, "drain": drain})


def devices(nodes: list[Node], verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """Every GPU with the job it holds and the verdicts that name it (newest first)."""
    by_device: dict[tuple[str, int], list[Verdict]] = {}
    for v in verdicts:
        if v.gpu is not None:
            by_device.setdefault((v.node, v.gpu), []).append(v)
    return [
        {"node": n.name, "gpu": g.index, "model": g.model, "job_id": g.job_id or None,
         "verdicts": [v.to_dict() for v in by_device.get((n.name, g.index), [])]}
        for n in nodes for g in n.gpus
    ]


def evidence_text(v: Verdict) -> str:
    e = v.evidence
    if v.kind == "stop":
        return str(e.get("why", ""))
    parts = []
    if e.get("rank_ratios"):
        parts.append("rank ratios " + ",".join(f"{x:.2f}" for x in e["rank_ratios"]))
    if e.get("tp_peer_ratios"):
        parts.append("TP peers " + ",".join(f"{k}:{x:.2f}" for k, x in e["tp_peer_ratios"].items()))
    if e.get("iteration_ratios"):
        parts.append("step ratios " + ",".join(f"{x:.2f}" for x in e["iteration_ratios"]))
    if e.get("why"):
        parts.append(str(e["why"]))
    return "; ".join(parts)


def health(args: argparse.Namespace) -> int:
    with connect(args) as client:
        nodes = client.nodes()
        verdicts = client.verdicts(job_id=args.job, limit=args.limit)
    if args.json:
        print_json({"nodes": [n.to_dict() for n in nodes], "devices": devices(nodes, verdicts),
                    "verdicts": [v.to_dict() for v in verdicts]})
        return 0
    print(table(("NODE", "HEALTH", "GPUS", "BUSY", "HEARTBEAT"),
                [(n.name, n.health, len(n.gpus), sum(1 for g in n.gpus if g.job_id), ago(n.last_heartbeat)) for n in nodes]))
    flagged = [d for d in devices(nodes, verdicts) if d["verdicts"]]
    if flagged:
        print()
        print(table(("DEVICE", "MODEL", "HOLDS", "LATEST VERDICT"),
                    [(f"{d['node']}/{d['gpu']}", d["model"], d["job_id"] or "-",
                      f"{d['verdicts'][0]['kind']} x{d['verdicts'][0]['ratio']:.2f} ({d['verdicts'][0]['job_id']} rank "
                      f"{d['verdicts'][0]['rank']})") for d in flagged]))
    print()
    if not verdicts:
        print("no verdicts: every reporting job runs at its expected speed and every rank beats")
        return 0
    print(table(("WHEN", "JOB", "RANK", "KIND", "RATIO", "ITERATION", "DEVICE", "EVIDENCE"),
                [(ago(v.at), v.job_id, v.rank, v.kind, f"{v.ratio:.2f}", v.iteration, v.device, evidence_text(v))
                 for v in verdicts]))
    return 0


def drain(args: argparse.Namespace) -> int:
    with connect(args) as client:
        result = client.drain(args.node, undo=args.undo, reason=args.reason)
    if args.json:
        print_json(result.__dict__)
    elif result.health == "DRAINING":
        print(f"{result.node} DRAINING: nothing new is placed there; {result.running_jobs} running job(s) go on")
    else:
        print(f"{result.node} {result.health}")
    return 0
