"""`rota bench forecaster`: forecast errors on held-out jobs and real traffic, and what they do to plans.

    rota bench forecaster [--json] [--jobs N] [--quant-jobs N] [--seed S] [--quantile Q]
    python -m rota.bench.forecaster ...   (the same, without the CLI)

- training / quantization: synthetic completed jobs (`generator`, durations matched to
  Philly); the first 75% teach the model, the last 25% are held out. Each held-out job
  is predicted by the model (P50, interval P10..P90), by the prior alone, and by its
  user-declared duration.
- realtime: the Helios Earth VCs with demand in at least 90% of their hours, one app
  each; a day-ahead forecast at every midnight from day 15 on, from all hours before,
  beside yesterday's and last week's same hours. Hours with under one GPU of demand, or
  whose naive references are missing, are not scored (percentage errors need a base).
- planning: the allocator scenarios executed with the `fast` policy on forecast,
  declared and true durations (`planning.execute`), measured on the true durations.
- traces: durations from history on two real Philly logs (`forecast_history`), each
  planned by `rota sim`'s engine on oracle, forecast, declared and no durations
  (`forecast_planning`; the JSON's `planning` is sjf's); realtime scaling on forecasts
  against a reactive scaler on Helios (`forecast_realtime`).

Ratios are predicted / actual: `p50_ratio` and `p90_ratio` are the median and the 90th
percentile of that ratio over jobs (hours), `mape` the mean of |ratio - 1|, and
`coverage` the share of actuals inside the model's P10..P90 interval (80% nominal).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rota.bench.forecast_bounds import bounds
from rota.bench.forecast_history import accuracy, forecast_log, philly_logs
from rota.bench.forecast_planning import GPUS, JSON_ARMS, PLANNING_POLICIES, PlanFigures, planning, recovered
from rota.bench.forecast_realtime import frontier, frontier_lines, realtime_vs_reactive
from rota.bench.forecast_traces import helios_hourly, quant_history, run_sampler, training_history
from rota.bench.forecast_workload import Synthetic, declared, quant_job, training_job
from rota.core.forecasting import realtime
from rota.core.forecasting.features import TrainingFeatures, quant_mapping, to_mapping
from rota.core.forecasting.predict import TRAINING_KINDS, Completion, Forecaster
from rota.core.forecasting.quantization import QuantModel
from rota.core.forecasting.training import TrainingModel, prior_only
from rota.core.planning import policy_fast
from rota.core.planning.metrics import measure
from rota.core.planning.rolling import execute
from rota.core.planning.scenario import Scenario, ScenarioError, load

REPO_ROOT = Path(__file__).resolve().parents[3]
HELD_OUT = 0.25


def ratios(predicted: Sequence[float], actual: Sequence[float], lower: Sequence[float] | None = None,
           upper: Sequence[float] | None = None) -> dict[str, float]:
    r = np.asarray(predicted, float) / np.asarray(actual, float)
    out = {"n": len(r), "mape": round(float(np.mean(np.abs(r - 1))), 4), "p50_ratio": round(float(np.median(r)), 4),
           "p90_ratio": round(float(np.percentile(r, 90)), 4)}
    if lower is not None and upper is not None:
        a = np.asarray(actual, float)
        out["coverage"] = round(float(np.mean((np.asarray(lower) <= a) & (a <= np.asarray(upper)))), 4)
    return out


def mapping(j: Synthetic) -> dict[str, Any]:
    f = j.features
    return to_mapping(f) if isinstance(f, TrainingFeatures) else quant_mapping(f)


def completions(jobs: Sequence[Synthetic]) -> list[Completion]:
    return [Completion(j.kind, mapping(j), j.gpus, j.actual_s, j.declared_s) for j in jobs]


def split(jobs: list[Synthetic]) -> tuple[list[Synthetic], list[Synthetic]]:
    cut = int(len(jobs) * (1 - HELD_OUT))
    return jobs[:cut], jobs[cut:]


def bench_jobs(train: list[Synthetic], test: list[Synthetic], forecaster: Forecaster) -> dict[str, Any]:
    actual = [j.actual_s for j in test]
    predicted = [forecaster.predict(j.kind, mapping(j), j.gpus) for j in test]
    cold = Forecaster()
    model = ratios([p.seconds_at(0.5) for p in predicted], actual,
                   [p.seconds_at(0.1) for p in predicted], [p.seconds_at(0.9) for p in predicted])
    prior = ratios([cold.predict(j.kind, mapping(j), j.gpus).seconds_at(0.5) for j in test], actual)
    if test[0].kind == "quantization":
        planned = np.array([p.planned_gpu_hours or 0.0 for p in predicted])
        used = np.array([j.actual_s * j.gpus / 3600 for j in test])
        model["planned_overrun"] = round(float(np.mean(used > planned)), 4)
        model["planned_ratio"] = round(float(np.median(planned / used)), 4)
    return {"model": model, "prior": prior, "declared": ratios([j.declared_s for j in test], actual)}


def learning_curve(train: list[Synthetic], test: list[Synthetic], sizes: Sequence[int]) -> list[tuple[int, float]]:
    actual = [j.actual_s for j in test]
    out = [(0, ratios([prior_only(j.features).p50_seconds for j in test], actual)["mape"])]  # type: ignore[arg-type]
    for n in sizes:
        m = TrainingModel([(j.features, j.actual_s) for j in train[:n]])  # type: ignore[misc]
        out.append((n, ratios([m.predict(j.features).p50_seconds for j in test], actual)["mape"]))  # type: ignore[arg-type]
    return out


def bench_realtime(src: Path | None = None, first_day: int = 14, min_share: float = 0.9) -> dict[str, Any]:
    traffic = helios_hourly(src)
    apps = [vc for vc, v in sorted(traffic.series.items()) if np.mean(v[~np.isnan(v)] > 0) >= min_share]
    rows: dict[str, list[float]] = {"profile": [], "last_day": [], "last_week": [], "actual": [], "lower": [], "upper": []}
    for vc in apps:
        y = traffic.series[vc]
        for day in range(first_day, len(y) // 24):
            cut = 24 * day
            curve = realtime.fit(y[max(0, cut - realtime.HISTORY_HOURS) : cut], traffic.start_hour + cut, 24)
            for k in range(24):
                t = cut + k
                if np.isnan(y[t]) or y[t] < 1 or np.isnan(y[t - 24]) or np.isnan(y[t - 168]):
                    continue
                for key, value in (("profile", curve.values[k]), ("last_day", y[t - 24]), ("last_week", y[t - 168]),
                                   ("actual", y[t]), ("lower", curve.lower[k]), ("upper", curve.upper[k])):
                    rows[key].append(float(value))
    out = {"profile": ratios(rows["profile"], rows["actual"], rows["lower"], rows["upper"]),
           "last_day": ratios(rows["last_day"], rows["actual"]), "last_week": ratios(rows["last_week"], rows["actual"])}
    out["profile"]["apps"] = len(apps)
    return out


def _steps(seconds: float, step: int) -> int:
    return max(1, math.ceil(seconds / step - 1e-9))


def estimates(s: Scenario, forecaster: Forecaster, rng: random.Random, quantile: float) -> dict[str, dict[str, int]]:
    """Per job: forecast and declared steps beside the true ones; features drawn to fit the truth."""
    out: dict[str, dict[str, int]] = {"forecast": {}, "declared": {}, "true": {}}
    for j in s.batch:
        true_s = (j.duration - rng.random()) * s.step_seconds  # somewhere inside its last step
        kind = j.kind
        try:
            if kind in TRAINING_KINDS:
                syn = training_job(rng, j.gpus, true_s)
                promise, fc = syn.declared_s, forecaster.predict(kind, to_mapping(syn.features), j.gpus)  # type: ignore[arg-type]
            elif kind == "quantization":
                syn = quant_job(rng, true_s, j.gpus)  # noisy features, as training_job draws them
                promise = syn.declared_s
                fc = forecaster.predict(kind, quant_mapping(syn.features), j.gpus)  # type: ignore[arg-type]
            else:
                raise ValueError("no features for this kind")
            seconds = fc.seconds_at(quantile)
        except ValueError:
            promise = declared(true_s, rng)
            seconds = forecaster.from_declared(kind, promise).seconds_at(quantile)
        out["forecast"][j.id] = _steps(seconds, s.step_seconds)
        out["declared"][j.id] = _steps(promise, s.step_seconds)
        out["true"][j.id] = j.duration
    return out


def bench_planning(scenarios: list[Scenario], forecaster: Forecaster, seed: int, quantile: float,
                   repeats: int) -> dict[str, Any]:
    """Each scenario's jobs get `repeats` independent draws of features and promises; figures are their means."""
    arms = ("forecast", "declared", "true")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {a: {s.name: [] for s in scenarios} for a in arms}
    planned: dict[str, list[int]] = {a: [] for a in arms}
    truth: list[int] = []
    for r in range(repeats):
        rng = random.Random(seed * 1000 + r)
        for s in scenarios:
            est = estimates(s, forecaster, rng, quantile)
            truth += [j.duration for j in s.batch]
            for arm in arms:
                planned[arm] += [est[arm][j.id] for j in s.batch]
                m = measure(s, execute(s, est[arm], policy_fast.plan))
                runs[arm][s.name].append({"utilization": m.utilization, "value": m.value, "completed": m.completed,
                                          "realtime_unmet": m.realtime_unmet})
    true_value = sum(statistics.mean(x["value"] for x in v) for v in runs["true"].values())
    out: dict[str, Any] = {}
    for arm in arms:
        per = {name: {k: round(statistics.mean(x[k] for x in v), 4) for k in v[0]} for name, v in runs[arm].items()}
        value = sum(v["value"] for v in per.values())
        out[arm] = {**ratios(planned[arm], truth), "utilization": round(statistics.mean(v["utilization"] for v in per.values()), 4),
                    "value": round(value, 1), "value_vs_true": round(value / true_value, 4),
                    "completed": round(sum(v["completed"] for v in per.values()), 2), "scenarios": per}
    out["forecast"]["quantile"] = quantile
    out["forecast"]["repeats"] = repeats
    return out


def bench_traces(src: Path | None, seed: int, with_bounds: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the issue's `traces` entries, per-log figures for the tables: accuracy, every policy's
    plans and, `with_bounds`, the in-hindsight bounds, which only the text report shows)."""
    entries, extra = [], []
    for name, jobs in philly_logs(src).items():
        scored = forecast_log(name, jobs, seed)
        acc = accuracy(scored)
        plans = planning(scored)
        primary = plans[PLANNING_POLICIES[0]]
        entries.append({"name": name, "mape": acc["mape"], "p90_coverage": acc["p90_coverage"],
                        "planning": {arm: {"avg_jct_s": round(primary[arm].avg_jct_s, 1)} for arm in JSON_ARMS}})
        # cheating upper bounds (forecast_bounds): text rows only, marked as such
        extra.append({**acc, "plans": plans, "bounds": bounds(scored, PLANNING_POLICIES[0]) if with_bounds else {}})
    return entries, extra


def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the JSON of the issue, extra figures for the text report)."""
    jobs = training_history(args.jobs, args.seed, args.traces)
    quant = quant_history(args.quant_jobs, args.seed + 1)
    (t_train, t_test), (q_train, q_test) = split(jobs), split(quant)
    forecaster = Forecaster(completions(t_train + q_train))
    scenarios = [load(p) for p in args.scenario]
    result: dict[str, Any] = {
        "training": bench_jobs(t_train, t_test, forecaster),
        "quantization": bench_jobs(q_train, q_test, forecaster),
        "realtime": bench_realtime(args.traces),
        "planning": bench_planning(scenarios, forecaster, args.seed, args.quantile, args.repeats),
    }
    result["traces"], logs = bench_traces(args.traces, args.seed, with_bounds=not args.json)
    result["realtime_vs_reactive"], weeks = realtime_vs_reactive(args.traces, profile=args.realtime_profile)
    sampler, rng = run_sampler(args.traces), random.Random(args.seed)
    real = [sampler.draw(rng, 600.0)[1] for _ in range(20000)]
    extra = {
        "durations": {"generated": [float(np.percentile([j.actual_s for j in jobs], q)) for q in (10, 50, 90)]
                      + [float(np.mean([j.actual_s for j in jobs]))],
                      "real": [float(np.percentile(real, q)) for q in (10, 50, 90)] + [float(np.mean(real))]},
        "curve": learning_curve(t_train, t_test, [n for n in (20, 50, 100, 300) if n < len(t_train)] + [len(t_train)]),
        "logs": logs,
        "realtime_weeks": weeks,
        "frontier": {} if args.json else frontier(args.traces),  # text rows only: 15 s
        "tiers": QuantModel([(j.features, j.actual_s) for j in q_train]).table(),  # type: ignore[misc]
    }
    return result, extra


def _row(name: str, d: dict[str, Any]) -> str:
    cov = f"{100 * d['coverage']:7.1f}%" if "coverage" in d else " " * 8
    return f"  {name:10} {d['n']:6d} {100 * d['mape']:7.1f}% {d['p50_ratio']:8.3f} {d['p90_ratio']:8.3f} {cov}"


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h"


def _plan_cell(f: PlanFigures) -> str:
    return f"{f.avg_jct_s / 3600:9.1f} {f.avg_queue_s / 3600:9.1f} {100 * f.utilization:6.1f}%"


def traces_table(logs: list[dict[str, Any]], weeks: dict[str, Any]) -> list[str]:
    lines = ["\ndurations from history (real Philly logs; `declared` is drawn): predicted / actual at submission"]
    lines.append(f"  {'log':15} {'scored':>6} {'arm':15} {'MAPE':>8} {'med ratio':>9} {'|log| err':>9}")
    for g in logs:
        for arm, mape in g["mape"].items():
            lines.append(f"  {g['name']:15} {g['scored']:6d} {arm:15} {100 * mape:7.0f}% {g['median_ratio'][arm]:9.3f} "
                         f"{g['log_mae'][arm]:9.3f}")
        lines.append(f"  {g['name']:15} model P90 coverage {100 * g['p90_coverage']:.1f}%")
    lines.append(f"planning on {GPUS} GPUs, one tenant (avg JCT h, avg queue h, utilisation); rota sim's engine")
    for g in logs:
        for policy, arms in g["plans"].items():
            for a, f in arms.items():
                share = recovered(arms, a) if a.startswith("forecast") else None
                lines.append(f"  {g['name']:15} {policy:5} {a:13} {_plan_cell(f)}"
                             + (f"   recovers {100 * share:.0f}% of declared->oracle" if share is not None else ""))
        sjf = g["plans"][PLANNING_POLICIES[0]]
        for a, f in g["bounds"].items():
            s = recovered({**sjf, a: f}, a)
            lines.append(f"  {g['name']:15} {PLANNING_POLICIES[0]:5} {a:21} {f.avg_jct_s / 3600:9.1f} h   in hindsight "
                         f"(cheating bound): {'-' if s is None else f'{100 * s:.0f}%'} of declared->oracle")
    lines.append(f"realtime scaling (Helios Earth, {weeks['apps']} VCs, swap cap 8 GPUs/h): unmet GPU-steps, GPU-hours")
    for label, key in (("judged: last week of May 2020", "judged"), ("tune: the week before", "tune")):
        lines.append(f"  {label}")
        for a, v in weeks[key].items():
            lines.append(f"    {a:19} {v['unmet_gpu_steps']:8.0f} {v['gpu_hours']:10.0f}")
    return lines


def table(result: dict[str, Any], extra: dict[str, Any]) -> str:
    head = f"  {'':10} {'n':>6} {'MAPE':>8} {'P50 r':>8} {'P90 r':>8} {'cover':>8}"
    lines: list[str] = []
    for part in ("training", "quantization", "realtime"):
        lines += [f"{part} (predicted / actual)", head]
        lines += [_row(name, d) for name, d in result[part].items()]
    q = result["quantization"]["model"]
    lines.append(f"  quantization plan (P50 GPU-hours + margin, rounded up): {100 * q['planned_overrun']:.1f}% of runs "
                 f"overran it; median plan / used {q['planned_ratio']:.2f}")
    d = extra["durations"]
    lines.append("\ngenerated vs real training durations (P10 / P50 / P90 / mean):")
    lines.append("  generated " + " / ".join(_hours(v) for v in d["generated"]))
    lines.append("  real      " + " / ".join(_hours(v) for v in d["real"]))
    lines.append("learning curve (completed jobs -> held-out MAPE): "
                 + ", ".join(f"{n}: {100 * m:.1f}%" for n, m in extra["curve"]))
    p = result["planning"]
    lines.append(f"\nplanning (fast policy, re-planned every step, measured on true durations; forecast at "
                 f"P{round(100 * p['forecast']['quantile'])})")
    lines.append(f"  {'scenario':18}" + "".join(f"{arm:>26}" for arm in p))
    for name in p["true"]["scenarios"]:
        cells = [p[arm]["scenarios"][name] for arm in p]
        lines.append(f"  {name:18}" + "".join(f"{100 * c['utilization']:8.1f}% {c['value']:8.0f} {c['completed']:4.1f} done"
                                              for c in cells))
    lines.append(f"  {'all':18}" + "".join(f"{100 * p[a]['utilization']:8.1f}% {p[a]['value']:8.0f} {p[a]['completed']:4.1f} done"
                                         for a in p))
    lines.append("  value vs true durations: " + ", ".join(f"{a} {100 * p[a]['value_vs_true']:.1f}%" for a in p)
                 + "; planned-duration MAPE: " + ", ".join(f"{a} {100 * p[a]['mape']:.1f}%" for a in p))
    lines += traces_table(extra["logs"], extra["realtime_weeks"])
    lines += frontier_lines(extra["frontier"]) if extra["frontier"] else []
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rota bench forecaster", description="Forecast errors and their effect on plans.")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the tables")
    ap.add_argument("--jobs", type=int, default=2000, help="synthetic training jobs (a quarter held out)")
    ap.add_argument("--quant-jobs", type=int, default=800, help="synthetic quantization runs (a quarter held out)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quantile", type=float, default=0.5, help="forecast quantile the plans use (default P50)")
    ap.add_argument("--repeats", type=int, default=5, help="draws of the scenario jobs' features (figures are means)")
    ap.add_argument("--traces", type=Path, default=None, help="the traces folder (default: ../shared/data/traces)")
    ap.add_argument("--realtime-profile", action="store_true",
                    help="also scale on the weekly-profile realtime model, re-fit every hour (about 2 more minutes)")
    ap.add_argument("--scenario", nargs="+", metavar="FILE",
                    default=sorted(str(p) for p in (REPO_ROOT / "bench" / "scenarios").glob("*.json")))
    args = ap.parse_args(argv)
    if args.jobs < 100 or args.quant_jobs < 100 or args.repeats < 1:
        print("--jobs and --quant-jobs: at least 100; --repeats: at least 1", file=sys.stderr)
        return 2
    if not 0 < args.quantile < 1:
        print(f"--quantile: must be in (0, 1), got {args.quantile}", file=sys.stderr)
        return 2
    try:
        result, extra = run(args)
    except (OSError, ScenarioError) as e:
        print(f"rota bench forecaster: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout)
        print()
    else:
        print(table(result, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
