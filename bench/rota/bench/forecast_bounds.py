"""How much of the declared -> oracle JCT gap could ANY duration predictor close on these logs?

Cheating upper bounds, not forecasters: each one reads the true run times of the very log
it is judged on (the future included), and is only restricted in *which* jobs' run times
it may pool for a job. If even these pooled in-hindsight means cannot recover half of the
gap, no online predictor built from the same features can, and the issue's planning aim is
out of reach on this trace's information (not only of our model's):

- `bound_limit`: the mean run time of every job of the log that declared the same limit
  (the best constant per limit, in hindsight);
- `bound_limit_gpus_hour`: the same per (limit, GPU count, quarter of the day of
  submission): every submit-time feature the log has, in hindsight;
- `bound_local_loo`: the mean run time of the *other* jobs that declared the same limit
  and were submitted within `LOCAL_HOURS` of this one (before or after): Philly's users
  submit bursts of alike jobs, and this pools a job's burst in hindsight, which no
  predictor at submission can (its siblings have not finished), leaving out only the
  job's own run time. Where it has no such sibling, `bound_limit`.

Declared limits are drawn (`rota.sim.estimates`), so these bounds are as drawn as the
`declared` arm; `python -m rota.bench.forecast_bounds --seeds 7,1,2,3,4` shows them over
several draws.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Hashable, Sequence

import numpy as np

from rota.bench.forecast_history import Scored, forecast_log, philly_logs
from rota.bench.forecast_planning import PlanFigures, planned, recovered, simulate_planned

LOCAL_HOURS = 6.0  # ours: about one working session's burst of submissions
BOUNDS = ("bound_limit", "bound_limit_gpus_hour", "bound_local_loo")
SHOWN = ("oracle", "forecast", "forecast_p50", "declared", *BOUNDS)


def group_means(keys: Sequence[Hashable], values: np.ndarray) -> np.ndarray:
    """Each item's value replaced by the mean over the items with its key."""
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = np.empty(len(values))
    for idx in groups.values():
        out[idx] = float(np.mean(values[idx]))
    return out


def local_loo_means(submit_s: np.ndarray, limits: np.ndarray, values: np.ndarray, hours: float) -> np.ndarray:
    """Mean value of the other items of the same limit submitted within `hours`; the limit's mean if none."""
    fallback = group_means(list(limits), values)
    out = fallback.copy()
    for i in range(len(values)):
        near = (np.abs(submit_s - submit_s[i]) <= hours * 3600) & (limits == limits[i])
        near[i] = False
        if near.any():
            out[i] = float(np.mean(values[near]))
    return out


def submit_features(s: Scored) -> list[tuple[float, int, int]]:
    """Each job's submit-time features: (declared limit, GPU count, quarter of the day)."""
    limits = np.asarray(s.p50["declared"], float)
    return [(float(d), j.gpus, int(j.hour // 6)) for d, j in zip(limits, s.jobs, strict=True)]


def bound_plans(s: Scored) -> dict[str, np.ndarray]:
    true = np.array([j.seconds for j in s.jobs])
    limits = np.asarray(s.p50["declared"], float)
    return {
        "bound_limit": group_means(list(limits), true),
        "bound_limit_gpus_hour": group_means(submit_features(s), true),
        "bound_local_loo": local_loo_means(np.array([j.submit_s for j in s.jobs]), limits, true, LOCAL_HOURS),
    }


def bounds(s: Scored, policy: str = "sjf") -> dict[str, PlanFigures]:
    """The in-hindsight arms' figures under `policy` (each a cheating upper bound, see above)."""
    return {arm: simulate_planned(s, plan, policy) for arm, plan in bound_plans(s).items()}


def shares(seeds: Sequence[int], policy: str = "sjf") -> dict[str, dict[int, dict[str, float | None]]]:
    """log -> seed of the drawn limits -> arm -> share of the declared -> oracle gap recovered."""
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for name, jobs in philly_logs().items():
        for seed in seeds:
            s = forecast_log(name, jobs, seed)
            figures = {a: simulate_planned(s, planned(s, a), policy) for a in SHOWN if a not in BOUNDS}
            figures.update(bounds(s, policy))
            out.setdefault(name, {})[seed] = {a: recovered(figures, a) for a in SHOWN if a not in ("oracle", "declared")}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m rota.bench.forecast_bounds", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="7", help="seeds of the drawn limits, comma-separated (7: the bench's)")
    ap.add_argument("--policy", default="sjf", choices=("sjf", "easy"))
    args = ap.parse_args(argv)
    table = shares([int(x) for x in args.seeds.split(",")], args.policy)
    arms = [a for a in SHOWN if a not in ("oracle", "declared")]
    print(f"share of the declared -> oracle avg-JCT gap recovered ({args.policy}); bound_* read the log's true run times")
    print(f"  {'log':15} {'seed':>4} " + " ".join(f"{a:>21}" for a in arms))
    for name, per_seed in table.items():
        print("\n".join(share_rows(name, per_seed, arms, 21)))
    return 0


def share_rows(name: str, per_seed: dict[int, dict[str, float | None]], arms: Sequence[str], width: int) -> list[str]:
    """A log's rows of a shares table: one per seed of the drawn limits, then their mean."""
    lines = [f"  {name:15} {seed:4d} " + " ".join(f"{_pct(row[a]):>{width}}" for a in arms)
             for seed, row in per_seed.items()]
    means = [statistics.fmean(vals) if (vals := [v for r in per_seed.values() if (v := r[a]) is not None]) else None
             for a in arms]
    return [*lines, f"  {name:15} {'mean':>4} " + " ".join(f"{_pct(m):>{width}}" for m in means)]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
