"""`rota pause|resume|move|checkpoint JOB [--to NODE]` and `rota checkpoints JOB` (docs/design.md §6).

    rota checkpoint JOB [--timeout S]                 a new image of the running job
    rota pause JOB [--timeout S]                      image it, stop it: PAUSED, GPUs free
    rota resume JOB [--to NODE] [--wait S]            back in the queue from its last image
    rota move JOB [--to NODE] [--timeout S] [--wait S]
    rota checkpoints JOB                              images, sizes, dedup, how long each took
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

from rota.cli.commands import connect
from rota.cli.output import ago, print_json, table

Handler = Callable[[argparse.Namespace], int]


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "all reused"


def _timeout(args: argparse.Namespace) -> timedelta | None:
    return timedelta(seconds=args.timeout) if args.timeout else None


def checkpoint(args: argparse.Namespace) -> int:
    with connect(args) as client:
        r = client.checkpoint(args.job, timeout=_timeout(args))
    if args.json:
        print_json(asdict(r))
        return 0
    print(f"{args.job}: image {r.image_id} at step {r.step} ({r.ranks} rank{'s' if r.ranks != 1 else ''}, "
          f"{size(r.logical_bytes)}; {size(r.bytes_written)} new in the store); copy {r.copy_seconds:.2f}s, "
          f"write {r.write_seconds:.2f}s")
    return 0


def pause(args: argparse.Namespace) -> int:
    with connect(args) as client:
        r = client.pause(args.job, timeout=_timeout(args))
    if args.json:
        print_json(asdict(r))
        return 0
    print(f"{args.job}: PAUSED at step {r.step} on {r.node}; GPUs released {r.pause_seconds:.2f}s after the request "
          f"(image {r.image_id} is written in the background)")
    return 0


def resume(args: argparse.Namespace) -> int:
    with connect(args) as client:
        r = client.resume(args.job, node=args.to or "", wait=timedelta(seconds=args.wait))
    if args.json:
        print_json(asdict(r))
        return 0
    source = f"image {r.image_id} (step {r.step})" if r.image_id else "the start (no image)"
    where = f"{r.state} on {r.node} GPUs {r.gpus}" if r.node else f"{r.state}: waiting for GPUs"
    print(f"{args.job}: resumed from {source}; {where}")
    return 0


def move(args: argparse.Namespace) -> int:
    with connect(args) as client:
        r = client.migrate(args.job, node=args.to or "", timeout=_timeout(args), wait=timedelta(seconds=args.wait))
    if args.json:
        print_json(asdict(r))
        return 0
    to = f"{r.node} GPUs {r.gpus} in {r.migrate_seconds:.2f}s" if r.node else "the queue (not placed yet)"
    print(f"{args.job}: moved from {r.from_node} at step {r.step} to {to}; paused in {r.pause_seconds:.2f}s "
          f"(image {r.image_id})")
    return 0


def checkpoints(args: argparse.Namespace) -> int:
    with connect(args) as client:
        found = client.checkpoints(args.job)
    if args.json:
        print_json(found.to_dict())
        return 0
    if not found.images:
        print(f"{args.job}: no checkpoint images")
        return 0
    rows = [
        (i.id, i.sequence, i.kind, i.state, i.step, i.ranks, size(i.logical_bytes), size(i.stored_bytes),
         ratio(i.dedup_ratio) if i.state == "complete" else "-", f"{i.copy_seconds:.2f}s", f"{i.write_seconds:.2f}s",
         ago(i.created_at), i.error[:60])
        for i in found.images
    ]
    print(table(("IMAGE", "SEQ", "KIND", "STATE", "STEP", "RANKS", "SIZE", "STORED", "DEDUP", "COPY", "WRITE", "AGE", "ERROR"),
                rows))
    print(f"total: {size(found.logical_bytes)} of state in {size(found.stored_bytes)} stored "
          f"(dedup {ratio(found.dedup_ratio)})")
    if found.operations:
        print()
        print(table(("OP", "KIND", "STATE", "FROM", "TO", "STREAMED", "PAUSE", "WRITE", "TOOK", "ERROR"), [
            (o.id, o.kind, o.state, o.source_node or "-", o.target_node or "-", "yes" if o.streamed else "-",
             f"{o.pause_seconds:.2f}s" if o.pause_seconds else "-", f"{o.write_seconds:.2f}s" if o.write_seconds else "-",
             f"{o.seconds:.2f}s" if o.seconds is not None else "-", o.error[:60])
            for o in found.operations]))
    return 0


def image_arguments(parser: argparse.ArgumentParser) -> None:
    """`rota checkpoint` and `rota pause`."""
    parser.add_argument("job")
    parser.add_argument("--timeout", type=float, default=0, help="seconds every rank has to reach a safe point")


def resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")
    parser.add_argument("--to", metavar="NODE", help="the node to run on: it waits for room there while that node is live")
    parser.add_argument("--wait", type=float, default=30, help="wait this long for its placement (default 30)")


def checkpoints_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job")


def move_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="a running job to move")
    parser.add_argument("--to", metavar="NODE", help="the node to run on: it waits for room there while that node is live")
    parser.add_argument("--timeout", type=float, default=0, help="seconds every rank has to reach a safe point")
    parser.add_argument("--wait", type=float, default=60, help="wait this long for its placement (default 60)")
