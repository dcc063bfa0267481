"""Does knowing a Philly job's tenant (its virtual cluster) bring the planning aim in reach?

No public GPU job log with users and durations could be shipped here (see
`bench/forecaster/README.md`), but the two Philly files we hold can be joined into one with
a group id: `philly_vc_arrivals_gavel.csv` has each VC's arrival offsets and GPU counts
(no durations, each VC's clock starting at its own first job), `philly_multigpu_pass.csv`
the jobs' submit times, GPU counts and run times (no VC). Both come from the same Philly
log, so for the right shift a VC's multi-GPU arrivals coincide with multi-GPU submissions
to the second and with the same GPU count. The join (`vc_labels`, ours):

- a VC's shift is the one with the most such coincidences (exact seconds); VCs whose best
  shift has fewer than `MIN_MATCHES` are left out (chance coincidences reach about 10);
- a job takes a VC when one of that VC's shifted arrivals of the same GPU count lies
  within `TOL_S`; a job that two VCs claim is left unlabelled.

Gavel kept at most 2,000 jobs a VC, so the VCs busiest in November and December are cut
short there: fewer of that log's jobs get a label.

Arms, as in `forecast_bounds` (sjf, share of the declared -> oracle average-JCT gap):
- `forecast`: the bench's (Kaplan–Meier mean of past jobs of the same limit);
- `forecast_vc`: the same pooled over past jobs of the same limit *and* VC, where 5 have
  finished; the `forecast` arm's value otherwise (a job without a label included);
- `bound_limit_vc_gpus_hour`: cheating, as `forecast_bounds`' bounds: the mean true run
  time of every job of the log with the job's (limit, VC, GPU count, quarter of the day),
  its own included; `..._loo` leaves the job's own run time out (falling back to the
  (limit, VC), the limit's, then the log's mean, the job left out of each): how much of
  the in-hindsight bound is the job reading itself.

Declared limits are drawn (`rota.sim.estimates`), as in the bench.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import sys
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rota.bench.forecast_bounds import group_means, share_rows, submit_features
from rota.bench.forecast_history import Scored, forecast_log, philly_logs
from rota.bench.forecast_planning import PlanFigures, planned, recovered, simulate_planned
from rota.core.forecasting.history import HistoryConfig
from rota.core.forecasting.survival import expected_durations
from rota.sim import traces as sim_traces

MIN_MATCHES = 20  # ours
TOL_S = 10.0  # ours: Gavel's offsets are whole seconds, as the submit times
ARMS = ("forecast", "forecast_vc", "bound_limit_gpus_hour", "bound_limit_vc_gpus_hour", "bound_limit_vc_gpus_hour_loo")


def vc_labels(src: Path | None = None) -> dict[str, str]:
    """job_id -> VC of the multi-GPU Philly jobs the join labels (see the module's docstring)."""
    src = src or sim_traces.traces_dir()
    with open(src / "philly_multigpu_pass.csv", newline="") as f:
        jobs = [(r["job_id"], int(float(r["submit_s"])), int(r["num_gpus"])) for r in csv.DictReader(f)]
    arrivals: dict[str, list[tuple[float, int]]] = {}
    with open(src / "philly_vc_arrivals_gavel.csv", newline="") as f:
        for r in csv.DictReader(f):
            arrivals.setdefault(r["vc"], []).append((float(r["arrival_s"]), int(float(r["num_gpus"]))))
    submits: dict[int, list[int]] = {}
    for _, s, g in jobs:
        submits.setdefault(g, []).append(s)
    claims: dict[str, set[str]] = {}
    for vc, rows in arrivals.items():
        shifts = Counter(s - int(a) for a, g in rows if g >= 2 for s in submits.get(g, ()))
        if not shifts or (best := shifts.most_common(1)[0])[1] < MIN_MATCHES:
            continue
        times = sorted((a + best[0], g) for a, g in rows)
        starts = [t for t, _ in times]
        for job_id, s, g in jobs:
            k = bisect.bisect_left(starts, s - TOL_S)
            while k < len(times) and times[k][0] <= s + TOL_S:
                if times[k][1] == g:
                    claims.setdefault(job_id, set()).add(vc)
                    break
                k += 1
    return {job: next(iter(vcs)) for job, vcs in claims.items() if len(vcs) == 1}


def loo_means(keys: Sequence[Hashable], values: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Each item's mean over the *other* items with its key; `fallback` where it has none."""
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = np.asarray(fallback, float).copy()
    for idx in groups.values():
        if len(idx) > 1:
            total = float(values[idx].sum())
            for i in idx:
                out[i] = (total - float(values[i])) / (len(idx) - 1)
    return out


def p50_errors(s: Scored, labels: dict[str, str], min_jobs: int = 5) -> dict[str, float]:
    """Mean |log(P50 / actual)| over the scored VC-labelled jobs: the model's P50, the running
    median of finished jobs of the same GPU count, and of the same VC and GPU count (the
    GPU count's while fewer than `min_jobs` of them have finished)."""
    by_finish = sorted(range(len(s.jobs)), key=lambda i: (s.jobs[i].finish_s, i))
    done: dict[tuple[str | None, int], list[float]] = {}
    vc_gpus: list[float] = []
    k = 0
    for j in s.jobs:
        while k < len(by_finish) and s.jobs[by_finish[k]].finish_s <= j.submit_s:
            d = s.jobs[by_finish[k]]
            done.setdefault((labels.get(d.id), d.gpus), []).append(d.seconds)
            k += 1
        own = done.get((labels.get(j.id), j.gpus), [])
        vc_gpus.append(float(np.median(own)) if len(own) >= min_jobs else float("nan"))
    mask = s.scored & np.array([j.id in labels for j in s.jobs])
    actual = np.array([j.seconds for j in s.jobs])
    gpus = s.p50["median_by_gpus"]
    arms = {"model": s.p50["model"], "median_by_gpus": gpus,
            "median_by_vc_gpus": np.where(np.isfinite(vc_gpus), vc_gpus, gpus)}
    return {a: round(float(np.mean(np.abs(np.log(v[mask] / actual[mask])))), 3) for a, v in arms.items()}


def group_plans(s: Scored, labels: dict[str, str]) -> dict[str, np.ndarray]:
    vc = [labels.get(j.id) for j in s.jobs]
    limits = np.asarray(s.p50["declared"], float)
    true = np.array([j.seconds for j in s.jobs])
    features = submit_features(s)  # (limit, GPU count, quarter of the day)
    past = [j.past(float(d)) for j, d in zip(s.jobs, limits, strict=True)]
    by_vc = [(d, v) if v is not None else None for d, v in zip(limits, vc, strict=True)]
    fine = [(d, v, g, q) for (d, g, q), v in zip(features, vc, strict=True)]
    loo = loo_means(list(limits), true, (true.sum() - true) / max(len(true) - 1, 1))
    loo = loo_means(list(zip(limits, vc, strict=True)), true, loo)
    return {
        "forecast_vc": np.array(expected_durations(past, list(s.expected), HistoryConfig().min_same, by_vc)),
        "bound_limit_gpus_hour": group_means(features, true),
        "bound_limit_vc_gpus_hour": group_means(fine, true),
        "bound_limit_vc_gpus_hour_loo": loo_means(fine, true, loo),
    }


@dataclass(frozen=True)
class GroupFigures:
    shares: dict[str, dict[int, dict[str, float | None]]]  # log -> seed -> arm -> share of the gap recovered
    coverage: dict[str, tuple[int, int]]  # log -> (VC-labelled jobs, jobs)
    p50_errors: dict[str, dict[str, float]]  # log -> arm -> mean |log(P50/actual)|, first seed's limits


def shares(seeds: Sequence[int], policy: str = "sjf") -> GroupFigures:
    labels = vc_labels()
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    coverage: dict[str, tuple[int, int]] = {}
    errors: dict[str, dict[str, float]] = {}
    for name, jobs in philly_logs().items():
        coverage[name] = (sum(j.id in labels for j in jobs), len(jobs))
        for seed in seeds:
            s = forecast_log(name, jobs, seed)
            if seed == seeds[0]:
                errors[name] = p50_errors(s, labels)
            figs: dict[str, PlanFigures] = {a: simulate_planned(s, planned(s, a), policy)
                                            for a in ("oracle", "declared", "forecast")}
            figs.update({a: simulate_planned(s, p, policy) for a, p in group_plans(s, labels).items()})
            out.setdefault(name, {})[seed] = {a: recovered(figs, a) for a in ARMS}
    return GroupFigures(out, coverage, errors)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m rota.bench.forecast_groups", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="7", help="seeds of the drawn limits, comma-separated (7: the bench's)")
    ap.add_argument("--policy", default="sjf", choices=("sjf", "easy"))
    args = ap.parse_args(argv)
    result = shares([int(x) for x in args.seeds.split(",")], args.policy)
    print(f"share of the declared -> oracle avg-JCT gap recovered ({args.policy}); bound_* read the log's true run times")
    print(f"  {'log':15} {'seed':>4} " + " ".join(f"{a:>28}" for a in ARMS))
    for name, per_seed in result.shares.items():
        print("\n".join(share_rows(name, per_seed, ARMS, 28)))
        labelled, total = result.coverage[name]
        print(f"  {name:15} VC-labelled jobs: {labelled} of {total}; mean |log(P50/actual)| on them "
              f"(first seed's limits): {result.p50_errors[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
