"""Build the semi-real Philly trace of issue 4 from the files in the shared traces folder.

Real (taken as is from the Philly log, via the files' sources; see their README):
- tenants: the Philly virtual clusters (VCs) that have a node count in
  philly_vc_nodes.csv; each VC's share is its node count;
- each job's VC, arrival time (per-VC offset, Gavel's extraction, so every VC's first job
  arrives at t = 0) and GPU count (philly_vc_arrivals_gavel.csv).
Changed:
- GPU counts that are not powers of two (7, 12, 20, 24: 0.1% of jobs) are rounded up,
  since blocks are buddy-aligned;
- the four VCs without a node count (34 jobs in all) are left out.
Drawn (seeded):
- multi-GPU durations: sampled from the real run times of philly_multigpu_pass.csv
  (Pass jobs, ≥ 2 GPUs, ≥ 10 min) whose GPU count rounds to the same power of two; 2-GPU
  jobs, absent from that file, sample the 4-GPU pool;
- 1-GPU durations: log-normal with the median and mean of all Philly GPU jobs (874 s and
  18,006 s, acme_cluster_summary.csv), so σ = sqrt(2 ln(mean / median)) ≈ 2.46, cut to
  [60 s, Philly's longest run]. The multi-GPU file holds no 1-GPU jobs, so this is the
  documented stand-in.
Added on request (Philly has no GPU types): a fraction of the jobs accept one GPU type
only, drawn from a generator of its own so the rest of the trace is the same with or
without it.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

from rota.sim.engine import start_masks
from rota.sim.workload import Job, write_jobs, write_tenants

REPO_ROOT = Path(__file__).resolve().parents[3]


def traces_dir() -> Path:
    """ROTA_TRACES_DIR, else the shared checkout beside the repository (as in CI)."""
    env = os.environ.get("ROTA_TRACES_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "traces"


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class OneGpuModel:
    median_s: float
    mean_s: float
    max_s: float
    min_s: float = 60.0

    @property
    def sigma(self) -> float:
        # For a log-normal, mean / median = exp(σ² / 2).
        return math.sqrt(2 * math.log(self.mean_s / self.median_s))

    def draw(self, rng: random.Random) -> float:
        x = rng.lognormvariate(math.log(self.median_s), self.sigma)
        return min(self.max_s, max(self.min_s, x))


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def one_gpu_model(src: Path) -> OneGpuModel:
    row = next(r for r in _read(src / "acme_cluster_summary.csv") if r["id"] == "Philly")
    return OneGpuModel(
        median_s=float(row["med_run_time_gpu"]),
        mean_s=float(row["avg_run_time_gpu"]),
        max_s=float(row["max_run_time_gpu"]),
    )


def duration_pools(src: Path) -> dict[int, list[float]]:
    """Real multi-GPU run times, keyed by GPU count rounded up to a power of two."""
    pools: dict[int, list[float]] = {}
    for r in _read(src / "philly_multigpu_pass.csv"):
        pools.setdefault(_pow2_ceil(int(r["num_gpus"])), []).append(float(r["run_s"]))
    return pools


def _pool_for(gpus: int, pools: dict[int, list[float]]) -> list[float]:
    if gpus in pools:
        return pools[gpus]
    # Nearest size in log scale; ties go to the larger (longer-running) size.
    best = min(pools, key=lambda g: (abs(math.log2(g) - math.log2(gpus)), -g))
    return pools[best]


def build(
    src: Path | None = None, seed: int = 0, max_jobs: int | None = None
) -> tuple[list[Job], dict[str, float]]:
    """The semi-real trace: jobs in submit order and tenant shares.

    `max_jobs` keeps the first N arrivals (a time prefix, so the load stays real rather
    than thinned).
    """
    src = src or traces_dir()
    shares = {r["vc"]: float(r["node num"]) for r in _read(src / "philly_vc_nodes.csv")}
    rows = [r for r in _read(src / "philly_vc_arrivals_gavel.csv") if r["vc"] in shares]
    rows.sort(key=lambda r: (float(r["arrival_s"]), r["vc"], int(r["seq"])))
    if max_jobs is not None:
        rows = rows[:max_jobs]
    rng = random.Random(seed)
    pools, model = duration_pools(src), one_gpu_model(src)
    jobs: list[Job] = []
    for r in rows:
        gpus = _pow2_ceil(int(float(r["num_gpus"])))
        dur = model.draw(rng) if gpus == 1 else rng.choice(_pool_for(gpus, pools))
        jobs.append(Job(f"{r['vc']}-{r['seq']}", r["vc"], float(r["arrival_s"]), round(dur, 3), gpus))
    return jobs, shares


def add_types(
    jobs: list[Job], node_types: tuple[str, ...], gpus_per_node: int, fraction: float, seed: int = 0
) -> list[Job]:
    """`fraction` of the jobs (drawn) accept one GPU type only: a type whose nodes can hold
    the job's aligned block (the live planner's start masks decide), drawn in proportion to
    its nodes. A job no type can hold alone stays untyped."""
    if not fraction or not node_types:
        return jobs
    gpus = len(node_types) * gpus_per_node
    masks = start_masks(gpus, gpus_per_node, node_types, ())
    kinds = sorted(set(node_types))
    rng = random.Random(f"types-{seed}")  # its own generator: durations stay as without types
    out: list[Job] = []
    for j in jobs:
        if rng.random() >= fraction:
            out.append(j)
            continue
        fits = [t for t in kinds if j.gpus <= gpus and masks.allowed_for(frozenset({t}), False, j.gpus)]
        pick = rng.choices(fits, weights=[node_types.count(t) for t in fits])[0] if fits else None
        out.append(replace(j, gpu_types=frozenset({pick})) if pick else j)
    return out


def make_trace(
    out: Path, src: Path | None = None, seed: int = 0, max_jobs: int | None = None,
    types: tuple[str, ...] = (), typed_fraction: float = 0.0, gpus_per_node: int = 8,
    source: str = "philly", days: float = 7.0,
) -> tuple[Path, Path]:
    if source == "helios-earth":
        from rota.sim.helios import build_helios

        jobs, shares = build_helios(src or traces_dir(), seed, days)
        jobs = jobs[:max_jobs] if max_jobs is not None else jobs
    else:
        jobs, shares = build(src, seed, max_jobs)
    jobs = add_types(jobs, types, gpus_per_node, typed_fraction, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_jobs(out / "JOBS.csv", jobs)
    write_tenants(out / "TENANTS.csv", shares)
    return out / "JOBS.csv", out / "TENANTS.csv"
