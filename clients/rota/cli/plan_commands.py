"""`rota plan`: the live cluster's current plan, as a terminal grid, a PNG or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from rota.cli.commands import connect
from rota.cli.output import print_json, table
from rota.cli.running import require_server


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--render", metavar="FILE.png", type=Path, help="write the grid as a PNG picture")


def plan(args: argparse.Namespace) -> int:
    from rota.cli import plan_picture as picture  # matplotlib is loaded only for --render

    if args.render:
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
    rows = [
        [j.job_id, j.tenant, j.kind, _when(j.start_step), ",".join(j.nodes) or j.node or "-", ",".join(map(str, j.gpus)) or "-"]
        for j in sorted(current.jobs, key=lambda j: (j.start_step if j.start_step >= -1 else 10**6, j.job_id))
    ]
    if rows:
        print("\n" + table(["job", "tenant", "kind", "start", "node", "gpus"], rows))
    return 0


def _when(step: int) -> str:
    return {-2: "not planned", -1: "running", 0: "now"}.get(step, f"step {step}")
