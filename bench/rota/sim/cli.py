"""`rota sim`: replay a trace under several policies, or build the semi-real Philly trace.

    rota sim --trace JOBS.csv --tenants TENANTS.csv --gpus N [--gpus-per-node 8]
             [--policy fifo,sjf,las,drf,ftf,fair,easy] [--json] [--lease-s 1800]
             [--checkpoint-s 5] [--resume-s 20] [--renew-s 0] [--starvation-s 14400]
             [--delay-s 300] [--render DIR] [--gpu-types a100:8,h100:8] [--switches N]
             [--durations oracle|forecast|declared|none] [--seed 0]
    rota sim make-trace --out DIR [--source philly|helios-earth] [--days 7] [--seed 0] [--jobs N] [--traces-dir DIR]
             [--gpu-types a100:8,h100:8 --typed-fraction F [--gpus-per-node 8]]

`--gpu-types` gives the nodes' GPU types in node order (TYPE:NODES, adding up to gpus /
gpus-per-node) and `--switches N` puts every N consecutive nodes under one switch; a job
that names gpu_types (or same_switch) in the trace then takes only the blocks the live
planner would give it. `make-trace --typed-fraction F` makes that fraction of the jobs
accept one type only, drawn in proportion to its nodes among the types that can hold it.

The JSON is {"gpus", "gpus_per_node", "shares", "config", "policies": {name: {summary figures...,
"runtime_s", "jobs": [{"id", "tenant", "gpus", "submit_s", "end_s", "intervals"}]}}}.
`--durations` sets what the planner believes of each job's duration (rota.sim.estimates;
sjf and easy read it, the others never do); every job still runs its true duration.
Without --json a table of the summary figures is printed. `--render DIR` also writes PNGs
of per-tenant fairness over time per policy, max F / min F over time and the JCT CDFs
(`rota.sim.render`; matplotlib is loaded only then), naming the files on stderr. Run it as
`rota sim ...` or `python -m rota.sim.cli ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from rota.core.fairness.ltgf import FairnessConfig
from rota.sim.engine import SimConfig, Simulator
from rota.sim.estimates import DURATIONS, with_durations
from rota.sim.metrics import JobRecord, summarize
from rota.sim.orderings import POLICIES
from rota.sim.quotas import QuotaSimulator, quota_figures, quota_line, read_quotas
from rota.sim.traces import make_trace
from rota.sim.workload import TraceError, node_switches, parse_gpu_types, read_jobs, read_tenants


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line on stderr, as every rota command does.
        self.exit(2, f"rota sim: {message}\n")


def _run_parser() -> _Parser:
    p = _Parser(
        prog="rota sim",
        usage="rota sim --trace JOBS.csv --tenants TENANTS.csv --gpus N [options]\n"
              "       rota sim make-trace --out DIR [options]",
        description="Replay a trace through the scheduling policies.",
        # `make-trace` is read before this parser (it has its own): name it here, or no help shows it.
        epilog="commands:\n  make-trace  build the semi-real Philly trace (JOBS.csv, TENANTS.csv); "
               "see `rota sim make-trace --help`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trace",
        required=True,
        type=Path,
        help="JOBS.csv: job_id,tenant,submit_s,duration_s,gpus[,priority]",
    )
    p.add_argument("--tenants", required=True, type=Path, help="TENANTS.csv: tenant,share")
    p.add_argument("--gpus", required=True, type=int)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--policy", default=",".join(POLICIES), help="comma-separated, from " + ",".join(POLICIES))
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--render",
        metavar="DIR",
        type=Path,
        default=None,
        help="write PNGs: per-tenant F over time per policy, max F / min F over time, JCT CDFs",
    )
    d = FairnessConfig()
    p.add_argument("--lease-s", type=float, default=d.lease_s)
    p.add_argument("--starvation-s", type=float, default=d.starvation_s)
    p.add_argument("--delay-s", type=float, default=d.delay_s)
    p.add_argument("--checkpoint-s", type=float, default=5.0)
    p.add_argument("--resume-s", type=float, default=20.0)
    p.add_argument("--renew-s", type=float, default=0.0)
    p.add_argument("--gpu-types", default=None, metavar="TYPE:NODES,...", help="the nodes' GPU types, in node order")
    p.add_argument("--switches", type=int, default=None, metavar="N", help="nodes per switch (consecutive ones)")
    p.add_argument("--quotas", type=Path, default=None, metavar="QUOTAS.csv",
                   help="tenant,guaranteed,limit[,parent]: limits and guarantees on top of each policy (rota.sim.quotas)")
    p.add_argument("--durations", choices=DURATIONS, default="oracle",
                   help="what the planner knows of durations (sjf and easy plan on it); jobs run their true ones")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn declared limits (--durations declared|forecast)")
    return p


def _trace_parser() -> _Parser:
    p = _Parser(
        prog="rota sim make-trace", description="Build the semi-real Philly trace (JOBS.csv, TENANTS.csv)."
    )
    p.add_argument("--out", required=True, type=Path, help="folder for JOBS.csv and TENANTS.csv")
    p.add_argument("--source", choices=("philly", "helios-earth"), default="philly",
                   help="philly (rota.sim.traces) or helios-earth (rota.sim.helios)")
    p.add_argument("--days", type=float, default=7.0, help="helios-earth: the first N days of May 2020")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn durations")
    p.add_argument("--jobs", type=int, default=None, help="keep only the first N arrivals")
    p.add_argument(
        "--traces-dir", type=Path, default=None, help="default: $ROTA_TRACES_DIR or ../shared/data/traces"
    )
    p.add_argument("--gpu-types", default=None, metavar="TYPE:NODES,...", help="the cluster's node types")
    p.add_argument("--typed-fraction", type=float, default=0.0, help="fraction of jobs that accept one type only")
    p.add_argument("--gpus-per-node", type=int, default=8, help="to type only jobs a type's nodes can hold")
    return p


def _placement(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes' GPU types and switches from --gpu-types and --switches (empty: not modelled)."""
    nodes = args.gpus // args.gpus_per_node if args.gpus_per_node > 0 else 0
    types = parse_gpu_types(args.gpu_types) if args.gpu_types else ()
    if types and len(types) != nodes:
        raise ValueError(f"--gpu-types: names {len(types)} nodes, the cluster has {nodes}")
    switches = node_switches(nodes, args.switches) if args.switches is not None else ()
    return types, switches


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(
            f"--policy: unknown {','.join(unknown) or '(none)'}; choose from {','.join(POLICIES)}"
        )
    jobs, shares = with_durations(read_jobs(args.trace), args.durations, args.seed), read_tenants(args.tenants)
    fcfg = FairnessConfig(lease_s=args.lease_s, starvation_s=args.starvation_s, delay_s=args.delay_s)
    types, switches = _placement(args)
    cfg = SimConfig(args.gpus, args.gpus_per_node, fcfg, args.checkpoint_s, args.resume_s, args.renew_s,
                    node_types=types, node_switches=switches)
    out: dict[str, Any] = {
        "gpus": cfg.gpus,
        "gpus_per_node": cfg.gpus_per_node,
        "shares": shares,  # with the jobs' intervals, all a reader needs to recompute every figure
        "config": {
            **fcfg.__dict__,
            "checkpoint_s": cfg.checkpoint_s,
            "resume_s": cfg.resume_s,
            "renew_s": cfg.renew_s,
            **({"gpu_types": args.gpu_types} if types else {}),
            **({"nodes_per_switch": args.switches} if switches else {}),
            "durations": args.durations,
        },
        "policies": {},
    }
    quotas = read_quotas(args.quotas) if getattr(args, "quotas", None) else None
    for name in policies:
        t0 = time.perf_counter()
        sim = Simulator(jobs, shares, cfg, POLICIES[name]()) if quotas is None else \
            QuotaSimulator(jobs, shares, cfg, POLICIES[name](), quotas)
        runs = sim.run()
        runtime = time.perf_counter() - t0
        records = [
            JobRecord(r.job.id, r.tenant, r.gpus, r.job.submit_s, r.end_s, r.intervals, r.job.priority)
            for r in runs
        ]
        out["policies"][name] = {
            **summarize(records, shares, cfg.gpus),
            "runtime_s": round(runtime, 3),
            **(quota_figures(sim, records) if isinstance(sim, QuotaSimulator) else {}),
            "jobs": [
                {
                    "id": j.id,
                    "tenant": j.tenant,
                    "gpus": j.gpus,
                    "submit_s": j.submit_s,
                    "end_s": j.end_s,
                    "intervals": j.intervals,
                }
                for j in records
            ],
        }
    return out


def _fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'policy':<6} {'avg JCT h':>10} {'util':>6} {'tenant maxF/minF':>17} {'min F':>6} {'tenant Jain':>11} "
        f"{'wf maxF/minF':>12} {'wf |F-1|':>8} {'jobs F±5%':>9} {'job Jain':>8} {'preempt':>8} {'sim s':>7}"
    )
    config = result.get("config", {})
    extra = "".join([f", types {config['gpu_types']}" if "gpu_types" in config else "",
                     f", {config['nodes_per_switch']} nodes per switch" if "nodes_per_switch" in config else ""])
    lines = [f"{result['gpus']} GPUs, {result['gpus_per_node']} per node{extra}", head]
    for name, p in result["policies"].items():
        lines.append(
            f"{name:<6} {p['avg_jct_s'] / 3600:>10.2f} {p['utilization']:>6.3f} {_fmt(p['tenant_f_max_min'], '.3f'):>17} "
            f"{_fmt(p['tenant_f_min'], '.3f'):>6} {p['tenant_jain']:>11.4f} {_fmt(p['tenant_waterfill_max_min'], '.3f'):>12} "
            f"{_fmt(p['tenant_waterfill_mean_dev'], '.3f'):>8} {p['job_f_in_band']:>9.3f} {p['job_jain']:>8.4f} {p['preemptions']:>8} "
            f"{p['runtime_s']:>7.1f}"
        )
    lines += [quota_line(name, p) for name, p in result["policies"].items() if "reclaims" in p]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["make-trace"]:
            a = _trace_parser().parse_args(argv[1:])
            if a.typed_fraction and not a.gpu_types:
                raise ValueError("--typed-fraction needs --gpu-types")
            if not 0 <= a.typed_fraction <= 1:
                raise ValueError(f"--typed-fraction must be in [0, 1], got {a.typed_fraction}")
            types = parse_gpu_types(a.gpu_types) if a.gpu_types else ()
            jobs_csv, tenants_csv = make_trace(a.out, a.traces_dir, a.seed, a.jobs, types=types,
                                               typed_fraction=a.typed_fraction, gpus_per_node=a.gpus_per_node,
                                               source=a.source, days=a.days)
            print(f"wrote {jobs_csv} and {tenants_csv}")
            return 0
        args = _run_parser().parse_args(argv)
        result = simulate(args)
        print(json.dumps(result) if args.json else table(result))
        if args.render is not None:
            for path in render_result(result, read_tenants(args.tenants), args.render):
                print(f"wrote {path}", file=sys.stderr)
    except BrokenPipeError:
        raise  # the reader went away (`| head`): not an error of the run (`rota` exits quietly)
    except (TraceError, ValueError, OSError) as e:
        print(f"rota sim: {e}", file=sys.stderr)
        return 1
    return 0


def render_result(result: dict[str, Any], shares: dict[str, float], out_dir: Path) -> list[Path]:
    """Draw the figures of `rota.sim.render` from a result in the JSON's shape."""
    from rota.sim import render  # numpy and matplotlib only when pictures are asked for

    runs = {
        name: [
            JobRecord(j["id"], j["tenant"], j["gpus"], j["submit_s"], j["end_s"], j["intervals"])
            for j in p["jobs"]
        ]
        for name, p in result["policies"].items()
    }
    return render.render(out_dir, runs, shares, result["gpus"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
