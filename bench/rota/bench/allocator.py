"""`rota bench allocator`: run policies over scenario files and compare them with FIFO.

    rota bench allocator --scenario FILE... [--policy fifo,fast,full] [--json] [--render DIR]
    rota bench allocator --scale [--json]   (rota.bench.allocator_scale: 8 to 8,192 GPUs)
    python -m rota.bench.allocator ...   (the same, without the CLI)

The JSON is docs/design.md §3's shape; every figure in it can be recomputed from its `grid`. The
table shows each policy's figures and the uplift over FIFO measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rota.bench import allocator_scale
from rota.cli import plan_picture as picture
from rota.core.planning import policies
from rota.core.planning.grid import Grid, Plan
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import Scenario, ScenarioError, load


def run_policy(s: Scenario, name: str, repeat: int, time_limit: float) -> dict[str, Any]:
    plan_fn = policies.get(name, time_limit)
    times: list[float] = []
    plan: Plan | None = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_fn(s)
        times.append((time.perf_counter() - t0) * 1000)
    assert plan is not None
    m = measure(s, plan.grid)
    out: dict[str, Any] = {"utilization": round(m.utilization, 4), "value": m.value,
                           "realtime_unmet": m.realtime_unmet, "completed": m.completed,
                           "runtime_ms": round(statistics.median(times), 3),
                           "objective": round(m.objective, 3)}
    for key in ("bound", "gap", "status"):
        if key in plan.stats:
            v = plan.stats[key]
            out[key] = round(v, 4) if isinstance(v, float) else v
    out["grid"] = plan.grid
    return out


def render(s: Scenario, grids: dict[str, Grid], folder: Path) -> Path:
    """FIFO above fast (or whatever ran), as PNG and as text, named after the scenario."""
    realtime = {r.id for r in s.realtime}
    title = f"{s.name}: {s.gpus} GPUs x {s.horizon} steps"
    (folder / f"{s.name}.txt").write_text(picture.text(grids, realtime=realtime, title=title))
    return picture.png(folder / f"{s.name}.png", grids, realtime=realtime, title=title)


def table(results: list[dict[str, Any]]) -> str:
    head = f"{'scenario':18} {'policy':6} {'util':>6} {'value':>8} {'unmet':>6} {'done':>5} {'ms':>9}  vs fifo"
    lines = [head, "-" * len(head)]
    uplift: dict[str, list[float]] = {}
    for r in results:
        base = r["policies"].get("fifo")
        for name, p in r["policies"].items():
            vs = ""
            if base and name != "fifo":
                points = 100 * (p["utilization"] - base["utilization"])
                pct = 100 * (p["value"] / base["value"] - 1) if base["value"] else 0.0
                uplift.setdefault(name, []).append(pct)
                vs = f"{points:+5.1f} pt  {pct:+6.1f}% value"
            extra = f"  gap {p['gap']:.1%}" if "gap" in p else (f"  {p['status']}" if "status" in p else "")
            lines.append(f"{r['name']:18} {name:6} {100 * p['utilization']:5.1f}% {p['value']:8.0f} "
                         f"{p['realtime_unmet']:6d} {p['completed']:5d} {p['runtime_ms']:9.2f}  {vs}{extra}")
    for name, pcts in uplift.items():
        lines.append(f"mean value uplift of {name} over fifo: {statistics.mean(pcts):+.1f}% "
                     f"(range {min(pcts):+.1f}% .. {max(pcts):+.1f}%)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rota bench allocator", description="Compare allocator policies with FIFO.")
    ap.add_argument("--scenario", nargs="+", default=[], metavar="FILE")
    ap.add_argument("--policy", default="fifo,fast,full", help="comma-separated: fifo,fast,full")
    ap.add_argument("--json", action="store_true", help="print docs/design.md §3's JSON instead of the table")
    ap.add_argument("--render", metavar="DIR", type=Path, help="write a PNG (and a text) picture of each scenario's grids")
    ap.add_argument("--repeat", type=int, default=9, help="runs per policy (runtime is the median)")
    ap.add_argument("--full-repeat", type=int, default=3, help="runs of the CP-SAT policy")
    ap.add_argument("--time-limit", type=float, default=2.0, help="full's time limit, seconds (its CP-SAT and window search)")
    ap.add_argument("--scale", action="store_true",
                    help="fast's runtime and full's gain over it at 8..8,192 GPUs (with --json: {\"scale\": [...]})")
    args = ap.parse_args(argv)
    if args.scale:
        return allocator_scale.scale(args.time_limit, args.json)
    if not args.scenario:
        ap.error("give --scenario FILE... (or --scale)")
    names = [n.strip() for n in args.policy.split(",") if n.strip()]
    bad = [n for n in names if n not in policies.NAMES]
    if bad:
        print(f"--policy: unknown policy {bad[0]!r}; one of {', '.join(policies.NAMES)}", file=sys.stderr)
        return 2
    results = []
    for path in args.scenario:
        try:
            s = load(path)
        except (OSError, ScenarioError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        runs = {n: run_policy(s, n, args.full_repeat if n == "full" else args.repeat, args.time_limit)
                for n in names}
        results.append({"name": s.name, "policies": runs})
        if args.render:
            args.render.mkdir(parents=True, exist_ok=True)
            shown = {n: runs[n]["grid"] for n in ("fifo", "fast") if n in runs} or {n: runs[n]["grid"] for n in runs}
            render(s, shown, args.render)
    if args.json:
        json.dump({"scenarios": results}, sys.stdout)
        print()
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
