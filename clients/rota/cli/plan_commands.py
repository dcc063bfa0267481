"""`rota plan`: the live cluster's current plan, as a terminal grid, a PNG or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from rota.cli.commands import connect
from rota.cli.output import print_json, table
from rota.cli.running import require_server
from rota.client.plan import CurrentPlan, PlannedJob


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--render", metavar="FILE.png", type=Path, help="write the grid as a PNG picture")


def plan(args: argparse.Namespace) -> int:
    from rota.cli import plan_picture as picture  # matplotlib is loaded only for --render

    if args.render:
        check_render_path(args.render)
        require_server("plan --render", ("matplotlib",))

    with connect(args) as client:
        current = client.current_plan()
    if args.json:
        print_json(current.to_dict())
        return 0
    realtime = {j.job_id for j in current.jobs if j.kind == "realtime"}
    step = f"{current.step_seconds:g}s"
    title = (f"plan epoch {current.epoch} by {current.policy} ({current.trigger}): "
             f"{len(current.grid)} GPUs x {current.horizon} steps of {step}")
    if args.render:
        picture.png(args.render, {"": current.grid}, labels=current.gpu_labels, realtime=realtime, title=title)
        print(f"wrote {args.render}")
        return 0
    print(picture.text({"": current.grid}, labels=current.gpu_labels, realtime=realtime, title=title), end="")
    f = current.figures
    print(f"\nutilisation {f['utilization']:.1%}  value {f['value']:.0f}  realtime unmet {f['realtime_unmet']:.0f}"
          f"  completed in horizon {f['completed']:.0f}  planned in {f['runtime_ms']:.1f} ms")
    rows = job_rows(current)
    if rows:
        print("\n" + table(["job", "tenant", "kind", "start", "gpus", "node [gpu indices]"], rows))
    return 0


def check_render_path(path: Path) -> None:
    """--render writes one file into a folder that is there: a mistyped folder is refused,
    not created."""
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--render: folder {str(folder)!r} does not exist (create it, or pick another path)")
    if path.is_dir():
        raise ValueError(f"--render: {str(path)!r} is a folder; name the PNG file to write")


def job_rows(current: CurrentPlan) -> list[list[str]]:
    """One row per job: when it starts, how many GPUs it holds (or will, at its start step),
    and on which node's GPUs (by index). Counted from the grid's column at that step, where
    a realtime app's replicas on every node show; from the job's own entry where the grid
    does not show it (another tenant's cells are `*`)."""
    ordered = sorted(current.jobs, key=lambda j: (j.start_step if j.start_step >= -1 else 10**6, j.job_id))
    return [[j.job_id, j.tenant, j.kind, when(j.start_step, current.step_seconds), *_held(current, j)]
            for j in ordered]


def _held(current: CurrentPlan, job: PlannedJob) -> tuple[str, str]:
    if job.start_step == -2:
        return "-", "-"
    column = max(job.start_step, 0)
    by_node: dict[str, list[int]] = {}
    for label, row in zip(current.gpu_labels, current.grid, strict=False):
        if column < len(row) and row[column] == job.job_id:
            node, _, index = label.rpartition("/")
            by_node.setdefault(node, []).append(int(index))
    if not by_node and job.node:
        by_node = {node: list(job.gpus) for node in (job.nodes or [job.node])}
    if not by_node:
        return "-", "-"
    count = sum(len(gpus) for gpus in by_node.values())
    return str(count), " ".join(f"{node} [{','.join(map(str, sorted(gpus)))}]" for node, gpus in by_node.items())


def when(step: int, step_seconds: float) -> str:
    """A job's start: running, now, in about the time until its step begins, or not planned."""
    if step in (-2, -1, 0):
        return {-2: "not planned", -1: "running", 0: "now"}[step]
    return f"in ~{span(step * step_seconds)}"


def span(seconds: float) -> str:
    """90 -> 1m30s, 3600 -> 1h, 5400 -> 1h30m: the two largest units that are not zero."""
    whole = round(seconds)
    parts = [(whole // 86400, "d"), (whole % 86400 // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n]
    return "".join(shown[:2]) or "0s"
