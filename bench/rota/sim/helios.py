"""A semi-real Helios Earth trace (SenseTime, May 2020) from the shared traces folder.

The shared data hold no Helios job log, only each virtual cluster's (VC's) per-minute count
of running and pending GPU jobs and GPUs (helios_earth_vc_demand_1min.csv.gz) and each VC's
daily GPU quota (helios_earth_vc_gpus_daily.csv). From those:

Real:
- tenants: the 16 Earth VCs of the demand file; each VC's share is its quota on the trace's
  first day (a VC with no quota that day gets the smallest quota of the others, so it is
  still a tenant with a due);
- arrivals: each minute in which a VC's job count (running + pending) rose by k, k jobs
  arrive in that minute, spread evenly across it. A job that arrives and leaves within the
  same minute, or arrives as another leaves, is not seen: these are net arrivals, a lower
  bound on the real ones;
- GPU count: the minute's rise in GPUs (running + pending) split over its k jobs, rounded
  up to a power of two and capped at 64 (1 when the GPUs did not rise).
Drawn (seeded), per VC:
- durations: log-normal with Earth's mean/median ratio of GPU run times
  (helios_cluster_summary.csv: 5,131 s / 234 s, σ ≈ 2.48), scaled so that the VC's
  submitted GPU-time over the window matches its real mean running + pending GPUs times the
  window (Little's law), cut to [60 s, 14 days].
"""

from __future__ import annotations

import csv
import gzip
import math
import random
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from rota.sim.workload import Job

MAX_GPUS = 64
MIN_S, MAX_S = 60.0, 14 * 86400.0
DEMAND_FILE = "helios_earth_vc_demand_1min.csv.gz"


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _earth_sigma(src: Path) -> float:
    with open(src / "helios_cluster_summary.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == "Earth")
    return math.sqrt(2 * math.log(float(row["avg_run_time_gpu"]) / float(row["med_run_time_gpu"])))


def _quotas(src: Path, day: str, vcs: list[str]) -> dict[str, float]:
    with open(src / "helios_earth_vc_gpus_daily.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["date"] == day)
    given = {v: float(row.get(v) or 0) for v in vcs}
    floor = min((q for q in given.values() if q > 0), default=1.0)
    return {v: q if q > 0 else floor for v, q in given.items()}


def _minutes(src: Path, days: float) -> dict[str, list[tuple[float, int, int]]]:
    """Per VC, (seconds since the first minute, jobs, GPUs) each minute within `days`."""
    out: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    t0: datetime | None = None
    with gzip.open(src / DEMAND_FILE, "rt", newline="") as f:
        for r in csv.DictReader(f):
            at = datetime.fromisoformat(r["time"])
            t0 = t0 or at
            s = (at - t0).total_seconds()
            if s >= days * 86400:
                continue
            jobs = int(r["running_gpujob_num"]) + int(r["pending_gpujob_num"])
            out[r["vc"]].append((s, jobs, int(r["running_gpu_num"]) + int(r["pending_gpu_num"])))
    return out


def build_helios(src: Path, seed: int = 0, days: float = 7.0) -> tuple[list[Job], dict[str, float]]:
    """The jobs (in submit order) and shares of the first `days` days of May 2020 on Earth."""
    series = _minutes(src, days)
    shares = _quotas(src, "2020-05-01", sorted(series))
    sigma, rng = _earth_sigma(src), random.Random(seed)
    jobs: list[Job] = []
    for vc in sorted(series):
        rows = sorted(series[vc])
        arrivals: list[tuple[float, int]] = []
        for (_, j0, g0), (s, j1, g1) in zip(rows, rows[1:], strict=False):
            k = j1 - j0
            size = min(MAX_GPUS, _pow2_ceil(max(1, math.ceil(max(0, g1 - g0) / k)))) if k > 0 else 0
            arrivals += [(s - 60 + 60 * (i + 0.5) / k, size) for i in range(max(0, k))]
        if not arrivals:
            continue
        # Little's law: Σ gpus · mean duration = mean demand · window.
        window = rows[-1][0] - rows[0][0] + 60
        mean_s = sum(g for _, _, g in rows) / len(rows) * window / sum(n for _, n in arrivals)
        median = mean_s / math.exp(sigma * sigma / 2)
        for i, (s, n) in enumerate(arrivals):
            dur = min(MAX_S, max(MIN_S, rng.lognormvariate(math.log(median), sigma)))
            jobs.append(Job(f"{vc}-{i}", vc, round(s, 3), round(dur, 3), n))
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    return jobs, shares
