"""`rota health`, `rota drain` and `rota replan`: the failure detector from the command line (docs/design.md §7).

    rota health [--job ID] [--limit N] [--json]   nodes, devices (bad ones out of the plan) and
                                                  verdicts with their evidence
    rota health --clear NODE:GPU [--clear NODE]   put bad devices back into the plan (admin)
    rota drain NODE [--undo] [--reason TEXT]      place nothing new on NODE; running jobs go on
    rota replan JOB [--apply [--wait S]]          the 3-D re-plan around the job's slow and dead
                                                  ranks; --apply checkpoints the job and restarts
                                                  it with the new layout (ROTA_LAYOUT)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rota.cli.commands import connect
from rota.cli.output import ago, print_json, table
from rota.client import DeviceHealth, InvalidArgumentError, Node, ReplanResult, Verdict

Handler = Callable[[argparse.Namespace], int]


def health_arguments(health_p: argparse.ArgumentParser) -> None:
    health_p.add_argument("--job", default="", help="only this job's verdicts")
    health_p.add_argument("--limit", type=int, default=100, help="at most this many verdicts (newest first)")
    health_p.add_argument("--clear", action="append", default=[], metavar="NODE:GPU",
                          help="put a bad device (or, as NODE, every bad device of a node) back into the plan "
                               "(admin); repeatable")
    health_p.add_argument("--reason", default="", help="with --clear: why (logged by the detector)")


def drain_arguments(drain_p: argparse.ArgumentParser) -> None:
    drain_p.add_argument("node")
    drain_p.add_argument("--undo", action="store_true", help="take new jobs again")
    drain_p.add_argument("--reason", default="", help="why (logged by the detector)")


def replan_arguments(replan_p: argparse.ArgumentParser) -> None:
    replan_p.add_argument("job_id")
    replan_p.add_argument("--apply", action="store_true",
                          help="checkpoint the job and restart it with the new layout (a job submitted with "
                               "accepts_layout_changes: true)")
    replan_p.add_argument("--wait", type=float, default=60.0, help="with --apply: seconds to wait for the restart's "
                                                                   "placement (0: return once it is queued)")
    replan_p.add_argument("--layers", type=int, default=0, help="model layers (default 32)")
    replan_p.add_argument("--microbatches", type=int, default=0, help="micro-batches per replica (default: as reported)")


def parse_device(text: str) -> tuple[str, int | None]:
    """`NODE:GPU` (or `NODE/GPU`) to (node, gpu); a bare `NODE` means every bad device of it."""
    for sep in (":", "/"):
        if sep in text:
            node, _, index = text.rpartition(sep)
            if not node or not index.isdigit():
                raise InvalidArgumentError(f"--clear: {text!r}: write NODE:GPU (e.g. node-1:3) or NODE", field="clear")
            return node, int(index)
    if not text:
        raise InvalidArgumentError("--clear: must not be empty", field="clear")
    return text, None


def clear_targets(texts: list[str]) -> dict[str, list[int]]:
    """Each node's GPUs to clear, in the order given; an empty list clears every bad GPU of the node."""
    whole: set[str] = set()
    some: dict[str, set[int]] = {}
    for text in texts:
        node, gpu = parse_device(text)
        some.setdefault(node, set())
        if gpu is None:
            whole.add(node)
        else:
            some[node].add(gpu)
    return {node: [] if node in whole else sorted(gpus) for node, gpus in some.items()}


def devices(nodes: list[Node], verdicts: list[Verdict], bad: list[DeviceHealth] | None = None) -> list[dict[str, Any]]:
    """Every GPU with the job it holds, whether it is out of the plan, and the verdicts that
    name it (newest first)."""
    by_device: dict[tuple[str, int], list[Verdict]] = {}
    for v in verdicts:
        if v.gpu is not None:
            by_device.setdefault((v.node, v.gpu), []).append(v)
    out_of_plan = {(d.node, d.gpu): d for d in bad or [] if d.state == "BAD"}
    return [
        {"node": n.name, "gpu": g.index, "model": g.model, "job_id": g.job_id or None,
         "state": "BAD" if (n.name, g.index) in out_of_plan else "OK",
         "bad_reason": out_of_plan[(n.name, g.index)].reason if (n.name, g.index) in out_of_plan else None,
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
    if args.clear:
        return clear(args)
    with connect(args) as client:
        nodes = client.nodes()
        verdicts = client.verdicts(job_id=args.job, limit=args.limit)
        bad = client.devices()
    if args.json:
        print_json({"nodes": [n.to_dict() for n in nodes], "devices": devices(nodes, verdicts, bad),
                    "bad_devices": [d.to_dict() for d in bad], "verdicts": [v.to_dict() for v in verdicts]})
        return 0
    print(table(("NODE", "HEALTH", "GPUS", "BAD", "BUSY", "HEARTBEAT"),
                [(n.name, n.health, len(n.gpus), sum(1 for d in bad if d.node == n.name),
                  sum(1 for g in n.gpus if g.job_id), ago(n.last_heartbeat)) for n in nodes]))
    if bad:
        print()
        print("Out of the plan until cleared (rota health --clear NODE:GPU):")
        print(table(("DEVICE", "SINCE", "JOB", "RANK", "REASON"),
                    [(d.device, ago(d.since), d.job_id or "-", "-" if d.rank is None else d.rank, d.reason) for d in bad]))
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


def clear(args: argparse.Namespace) -> int:
    targets = clear_targets(args.clear)
    cleared: list[DeviceHealth] = []
    with connect(args) as client:
        for node, gpus in targets.items():
            cleared.extend(client.clear_devices(node, gpus, reason=args.reason))
    if args.json:
        print_json({"cleared": [d.to_dict() for d in cleared]})
    elif not cleared:
        print("no bad device there: nothing to clear")
    else:
        for d in cleared:
            print(f"{d.device} is back in the plan (was out since {ago(d.since)}: {d.reason})")
    return 0


def replan_text(r: ReplanResult) -> str:
    lines = [f"layout tp={r.layout['tp']} pp={r.layout['pp']} dp={r.layout['dp']}: throughput "
             f"{r.throughput_before:.2f} as is, {r.throughput_after:.2f} re-planned, "
             f"{r.throughput_drop_group:.2f} dropping the affected replicas (healthy = 1.00)"]
    lines.append(table(("REPLICA", "STAGE", "RANKS", "LAYERS", "SPEED"),
                       [(s["replica"], s["stage"], ",".join(str(x) for x in s["ranks"]), s["layers"], f"{s['speed']:.2f}")
                        for s in r.stages]))
    lines.append(f"micro-batches per replica: {r.microbatches_per_replica}"
                 + (f"; idle ranks: {r.idle_ranks}" if r.idle_ranks else ""))
    if r.applied:
        where = f"restarted on {r.node}" if r.node else "queued to restart"
        lines.append(f"applied: checkpointed at step {r.step} (image {r.image_id}) on {r.from_node or '-'}; {where} "
                     "with the new layout (ROTA_LAYOUT)")
    else:
        lines.append("not applied (rota replan JOB --apply restarts a job that accepts layout changes)")
    return "\n".join(lines)


def replan_cmd(args: argparse.Namespace) -> int:
    with connect(args) as client:
        result = client.replan(job_id=args.job_id, layers=args.layers, microbatches=args.microbatches, apply=args.apply,
                               wait=timedelta(seconds=max(0.0, args.wait)))
    if args.json:
        print_json(result.to_dict())
    else:
        print(replan_text(result))
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
