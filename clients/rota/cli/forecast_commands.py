"""`rota forecast` and `rota traffic`: the forecaster from the command line (docs/design.md §5).

    rota forecast JOBFILE [--quantile Q] [--json]     what the job will take, before submitting it
    rota traffic push APP FILE [--json]               an app's hourly request counts (CSV or JSON)
    rota traffic curve APP [--horizon N] [--capacity R] [--max-swap K] [--json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rota.cli.commands import connect
from rota.cli.output import print_json, table
from rota.client import job_spec_from_mapping, load_job_file
from rota.client.forecast import load_traffic

Handler = Callable[[argparse.Namespace], int]


def human(seconds: float) -> str:
    """1h 12m, 38m, 45s, 2d 3h."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def forecast(args: argparse.Namespace) -> int:
    data = load_job_file(args.file)
    spec = job_spec_from_mapping(data, base_dir=Path(args.file).resolve().parent)
    with connect(args) as client:
        f = client.forecast(spec=spec, quantile=args.quantile)
    name = spec.name or Path(args.file).stem
    kind = str(data.get("kind", "training"))
    declared = spec.duration.total_seconds() if spec.duration is not None else None
    # A gang's GPUs: nodes x gpus_per_node when `gpus` is left at its default (as the server sets it).
    gpus = spec.nodes * spec.gpus_per_node if spec.nodes and spec.gpus_per_node and spec.gpus == 1 else spec.gpus
    if args.json:
        print_json({"name": name, "kind": kind, "gpus": gpus, "declared_seconds": declared, **f.to_dict()})
        return 0
    print(f"{name} ({kind}, {gpus} GPU{'s' if gpus != 1 else ''}): P50 {human(f.p50_seconds)}, "
          f"P90 {human(f.p90_seconds)}  (80% interval {human(f.p10_seconds)} .. {human(f.p90_seconds)})")
    if args.quantile != 0.5:
        print(f"  at P{round(100 * args.quantile)}: {human(f.seconds)}")
    planned = f"; planned {f.gpu_hours_planned:.0f} (with the safety margin)" if f.gpu_hours_planned else ""
    print(f"  GPU-hours: P50 {f.gpu_hours_p50:.2f}, P90 {f.gpu_hours_p90:.2f}{planned}")
    notes = [f"model: {f.model}, from {f.observations} completed jobs"]
    if f.prior_seconds:
        notes.append(f"physical prior alone: {human(f.prior_seconds)}")
    if declared:
        notes.append(f"declared: {human(declared)}")
    print("  " + "; ".join(notes))
    return 0


def traffic(args: argparse.Namespace) -> int:
    if args.traffic_command == "push":
        samples = load_traffic(args.file)
        with connect(args) as client:
            recorded = client.push_traffic(app=args.app, samples=samples)
        if args.json:
            print_json({"app": args.app, "samples": len(samples), "recorded": recorded})
        else:
            print(f"{args.app}: {recorded} new hourly samples recorded ({len(samples) - recorded} already known)")
        return 0
    with connect(args) as client:
        curve = client.demand_curve(app=args.app, horizon=args.horizon, capacity=args.capacity, max_swap=args.max_swap)
    if args.json:
        print_json(curve.__dict__)
        return 0
    rows = [(k, f"{t:.1f}", g, f"{lo:g}..{hi:g}")
            for k, (t, g, lo, hi) in enumerate(zip(curve.traffic, curve.gpus, curve.lower, curve.upper, strict=True))]
    print(table(("STEP", "REQUESTS/H", "GPUS", "P10..P90 GPUS"), rows))
    return 0


def forecast_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file")
    parser.add_argument("--quantile", type=float, default=0.5, help="also show this quantile (default: P50)")


def push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app")
    parser.add_argument("file", help="CSV with a header hour,requests (ISO time or unix seconds), or JSON")


def curve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app")
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--capacity", type=float, default=0.0, help="requests per hour one GPU replica serves")
    parser.add_argument("--max-swap", type=int, default=0, help="GPUs added + removed per step (0: the app's)")
