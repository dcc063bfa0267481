"""`rota bench detector`: normalised fail-slow detection against the raw-time baseline.

    rota bench detector --config FILE [--json]
    rota bench detector --real [--runs N] [--save DIR] [--json]   (the real pipeline job under real faults)
    rota bench detector --replay DIR [--tune-seeds 0,1] [--json]   (saved real runs, rescored)
    python -m rota.bench.detector ...   (the same, without the CLI)

The generator (`rota.bench.detector_workload`) plays the config's iterations, with its faults,
`trials` times (seeds seed, seed+1, …). Both detectors see the same reports; fail-stop
comes from the same heartbeats (every rank beats each `heartbeat_interval_s` of simulated
wall time until it stops; silent for three intervals = dead), so the two differ only in
how they judge time. Scores:
- a verdict is correct when it names a faulty rank, with the fault's kind, while the fault
  is active (or within k iterations of its end); any other verdict is a false alarm;
- precision = correct / all verdicts; recall = faults with a correct verdict / faults;
- false_alarms_per_1k = false alarms per 1,000 iterations; mean_delay_iters = iterations
  from a fault's start to its first correct verdict, over detected faults.
The re-plan part takes trial 0's normalised verdicts in order (a slow rank's speed is 1 /
its measured ratio; a stopped one's 0) and, after each, compares the re-planned
throughput with the layout as it is and with dropping every affected replica.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rota.bench.detector_workload import BenchConfig, Fault, Generator, parse_config
from rota.core.detection.failslow import JOB, STOP, FailSlowDetector, RawBaseline, Verdict
from rota.core.detection.failstop import HeartbeatMonitor
from rota.core.detection.replan import replan
from rota.core.errors import InvalidArgument


def run_trial(cfg: BenchConfig, seed: int) -> tuple[list[Verdict], list[Verdict]]:
    """(normalised verdicts, raw verdicts) of one generated run."""
    normalized, raw = FailSlowDetector(cfg.layout, cfg.detector), RawBaseline(cfg.layout, cfg.detector)
    h = cfg.heartbeat_interval_s
    monitor = HeartbeatMonitor(default_interval_s=h)
    out_n: list[Verdict] = []
    out_r: list[Verdict] = []
    for step in Generator(cfg, seed):
        for r in range(cfg.layout.ranks):
            until = step.stopped_at.get(r, step.end_s)
            monitor.beat(r, (until // h) * h)  # the last beat of a rank beating every h seconds
        stops = [Verdict(int(s.source), STOP, step.report.iteration, s.silent_s / s.timeout_s,  # type: ignore[call-overload]
                         {"silent_s": s.silent_s, "timeout_s": s.timeout_s}) for s in monitor.expired(step.end_s)]
        out_n += normalized.observe(step.report) + stops
        out_r += raw.observe(step.report) + stops
    return out_n, out_r


def _correct(v: Verdict, faults: Sequence[Fault], grace: int) -> Fault | None:
    for f in faults:
        end = f.end + grace if f.end is not None else None
        if v.rank == f.rank and v.kind == f.kind and f.start <= v.iteration and (end is None or v.iteration < end):
            return f
    return None


def score(runs: Sequence[list[Verdict]], faults: Sequence[Fault], iterations: int, grace: int) -> dict[str, Any]:
    right = wrong = 0
    detected, delays = 0, []
    for verdicts in runs:
        first: dict[Fault, int] = {}
        for v in verdicts:
            f = _correct(v, faults, grace)
            if f is None:
                wrong += 1
                continue
            right += 1
            first.setdefault(f, v.iteration)
        detected += len(first)
        delays += [it - f.start for f, it in first.items()]
    total = right + wrong
    return {
        "precision": round(right / total, 4) if total else 1.0,
        "recall": round(detected / (len(faults) * len(runs)), 4) if faults else 1.0,
        "false_alarms_per_1k": round(1000 * wrong / (iterations * len(runs)), 3),
        "mean_delay_iters": round(statistics.mean(delays), 2) if delays else None,
    }


def _listing(runs: Sequence[list[Verdict]]) -> list[dict[str, Any]]:
    many = len(runs) > 1
    return [{"rank": v.rank, "kind": v.kind, "iteration": v.iteration, **({"trial": i} if many else {})}
            for i, verdicts in enumerate(runs) for v in verdicts]


def replans(cfg: BenchConfig, verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    speeds = [1.0] * cfg.layout.ranks
    out = []
    for v in sorted(verdicts, key=lambda v: v.iteration):
        if v.rank == JOB:
            continue
        speeds[v.rank] = 0.0 if v.kind == STOP else min(speeds[v.rank], 1 / v.ratio)
        plan = replan(cfg.layout, speeds, layers=cfg.layers, microbatches=cfg.microbatches)
        out.append({
            "after_verdict": {"rank": v.rank, "kind": v.kind, "iteration": v.iteration},
            "speeds": {str(r): round(s, 4) for r, s in enumerate(speeds) if s < 1.0},
            **{k: val for k, val in plan.as_dict().items() if k != "stages"},
            "tp_groups": [[list(st.ranks) for st in plan.stages if st.replica == d] for d in range(cfg.layout.dp)],
        })
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    trials = [run_trial(cfg, cfg.seed + i) for i in range(cfg.trials)]
    grace = cfg.detector.consecutive
    result: dict[str, Any] = {
        "iterations": cfg.iterations, "trials": cfg.trials, "layout": cfg.layout.as_dict(),
        "detector": {"threshold": cfg.detector.threshold, "consecutive": cfg.detector.consecutive,
                     "warmup": cfg.detector.warmup, "raw_window": cfg.detector.window},
    }
    for name, index in (("normalized", 0), ("raw", 1)):
        runs = [t[index] for t in trials]
        result[name] = {**score(runs, cfg.scored_faults(), cfg.iterations, grace), "verdicts": _listing(runs)}
    result["replan"] = replans(cfg, trials[0][0])
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def _print(result: dict[str, Any]) -> None:
    d = result["detector"]
    print(f"{result['trials']} x {result['iterations']} iterations, layout {result['layout']}, "
          f"threshold {d['threshold']}, k={d['consecutive']}, warm-up {d['warmup']} ({result['seconds']}s)")
    print(f"{'detector':<11} {'precision':>9} {'recall':>7} {'false/1k':>9} {'delay':>7} {'verdicts':>8}")
    for name in ("normalized", "raw"):
        r = result[name]
        delay = "-" if r["mean_delay_iters"] is None else f"{r['mean_delay_iters']:.1f}"
        print(f"{name:<11} {r['precision']:>9.4f} {r['recall']:>7.4f} {r['false_alarms_per_1k']:>9.3f} "
              f"{delay:>7} {len(r['verdicts']):>8}")
    for p in result["replan"]:
        v = p["after_verdict"]
        print(f"re-plan after {v['kind']} rank {v['rank']} at iteration {v['iteration']}: throughput "
              f"{p['throughput_before']:.3f} as is, {p['throughput_after']:.3f} re-planned, "
              f"{p['throughput_drop_group']:.3f} dropping the affected replicas (healthy = 1)")
        print(f"  layers per stage {p['layers_per_stage']}, micro-batches per replica {p['microbatches_per_replica']}, "
              f"TP groups {p['tp_groups']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rota bench detector", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, help="the benchmark's JSON config (generated runs)")
    parser.add_argument("--real", action="store_true",
                        help="run the real pipeline job (examples/pipeline_failslow.py) under real faults")
    parser.add_argument("--runs", type=int, default=3, help="--real: seeds per fault (default 3)")
    parser.add_argument("--live", action="store_true",
                        help="the loop closed live: the real job on a local cluster, throttled, flagged, re-planned "
                             "with `rota replan --apply`; its rates before, while slow and after")
    parser.add_argument("--live-runs", type=int, default=1, help="--live: runs, one after another (default 1)")
    parser.add_argument("--save", type=Path, help="--real: keep each run's lines and fault windows here (JSON); "
                                                  "--live: the cluster's folder and each run's record, in DIR/live")
    parser.add_argument("--replay", type=Path, help="rescore runs saved by --real --save DIR, running nothing")
    parser.add_argument("--tune-seeds", default="", help="--replay: tune the sequential detector on these seeds "
                        "(comma-separated) and score the other seeds only")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.replay is not None:
        from rota.bench.detector_real_eval import evaluate, print_eval

        try:
            seeds = {int(s) for s in args.tune_seeds.split(",") if s.strip()}
        except ValueError:
            parser.error(f"--tune-seeds: give seeds as integers separated by commas (got {args.tune_seeds!r})")
        evaluated = evaluate(args.replay, seeds or None)
        if args.json:
            json.dump({"replay": evaluated}, sys.stdout, indent=2)
            print()
        else:
            print_eval(evaluated)
        return 0
    if args.config is None and not args.real and not args.live:
        parser.error("give --config FILE, --real, --live, --replay DIR, or a combination")
    if args.runs < 1 or args.live_runs < 1:
        parser.error(f"--runs, --live-runs: must be at least 1 (got {args.runs}, {args.live_runs})")
    result = _generated(args.config) if args.config is not None else {}
    _run_real(args, result)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    if args.config is not None:
        _print(result)
    _print_real(args, result)
    return 0


def _run_real(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """--real and --live: the real job's fault runs and the live re-plan (torch, cgroups, a
    local cluster: imported only here)."""
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.real:
        from rota.bench.detector_real_bench import run_real

        result["real"] = run_real(args.runs, log=log, save_to=args.save)
    if args.live:
        from rota.bench.detector_live_replan import run_live

        result["live"] = run_live(log, args.live_runs, args.save / "live" if args.save is not None else None)


def _print_real(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.real:
        from rota.bench.detector_real_bench import print_real

        print_real(result["real"])
    if args.live:
        from rota.bench.detector_live_replan import print_live

        print_live(result["live"])


def _generated(path: Path) -> dict[str, Any]:
    try:
        cfg = parse_config(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config: {path} is not JSON: {exc}") from None
    except InvalidArgument as exc:
        raise ValueError(f"--config: {exc}") from None
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
