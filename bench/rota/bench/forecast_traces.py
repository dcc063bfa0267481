"""The real data the forecaster's benchmark stands on (`../shared/data/traces/`, see its README).

- Philly GPU counts and run times, read through `rota.sim.traces` (the same semi-real
  durations the simulator replays), to which the synthetic jobs are matched;
- Helios Earth's per-minute GPU demand per virtual cluster (May 2020), averaged into
  hourly running + pending GPUs: the realtime forecaster's traffic, one app per VC.
  Hours in which the whole cluster reported nothing (May 10 and two hours of May 12)
  are logging gaps, kept as missing rather than as zero demand.
"""

from __future__ import annotations

import csv
import gzip
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from rota.bench.forecast_workload import Synthetic, quant_job, training_job
from rota.sim import traces as sim_traces

MAX_GPUS = 64


def traces_dir() -> Path:
    return sim_traces.traces_dir()


@dataclass(frozen=True)
class RunSampler:
    """(GPU count, run seconds) pairs distributed like Philly's."""

    gpu_counts: list[int]
    pools: dict[int, list[float]]
    one_gpu: sim_traces.OneGpuModel

    def draw(self, rng: random.Random, min_s: float) -> tuple[int, float]:
        gpus = rng.choice(self.gpu_counts)
        pool = self.pools.get(gpus) or self.pools[min(self.pools, key=lambda g: (abs(math.log2(g / gpus)), -g))]
        while (run := self.one_gpu.draw(rng) if gpus == 1 else rng.choice(pool)) < min_s:
            pass
        return gpus, run


def run_sampler(src: Path | None = None) -> RunSampler:
    src = src or traces_dir()
    with open(src / "philly_vc_arrivals_gavel.csv", newline="") as f:
        counts = [1 << max(0, int(float(r["num_gpus"])) - 1).bit_length() for r in csv.DictReader(f)]
    return RunSampler([min(c, MAX_GPUS) for c in counts], sim_traces.duration_pools(src), sim_traces.one_gpu_model(src))


def training_history(n: int, seed: int, src: Path | None = None, min_s: float = 600.0) -> list[Synthetic]:
    """`n` completed training jobs with real (Philly-distributed) sizes and durations."""
    rng = random.Random(seed)
    sampler = run_sampler(src)
    return [training_job(rng, *sampler.draw(rng, min_s)) for _ in range(n)]


def quant_history(n: int, seed: int) -> list[Synthetic]:
    rng = random.Random(seed)
    return [quant_job(rng) for _ in range(n)]


@dataclass(frozen=True)
class Traffic:
    """Hourly series per app, aligned: `start_hour` is the unix hour of index 0; NaN = no data.
    `series` is each hour's mean, `last` each hour's last reading (what a scaler sees at its end)."""

    start_hour: int
    series: dict[str, np.ndarray]
    last: dict[str, np.ndarray]


def helios_hourly(src: Path | None = None) -> Traffic:
    path = (src or traces_dir()) / "helios_earth_vc_demand_1min.csv.gz"
    sums: dict[str, dict[int, list[float]]] = {}
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            second = int(datetime.fromisoformat(r["time"] + "+00:00").timestamp())
            cell = sums.setdefault(r["vc"], {}).setdefault(second // 3600, [0.0, 0.0, -1.0, 0.0])
            demand = float(r["running_gpu_num"]) + float(r["pending_gpu_num"])
            cell[0] += demand
            cell[1] += 1
            if second >= cell[2]:
                cell[2], cell[3] = second, demand
    start = min(min(h) for h in sums.values())
    end = max(max(h) for h in sums.values()) + 1
    series = {vc: np.full(end - start, np.nan) for vc in sums}
    last = {vc: np.full(end - start, np.nan) for vc in sums}
    for vc, hours in sums.items():
        for hour, (total, count, _, reading) in hours.items():
            series[vc][hour - start] = total / count
            last[vc][hour - start] = reading
    cluster = np.nansum(np.vstack(list(series.values())), axis=0)
    for vc, values in series.items():
        values[cluster == 0] = np.nan  # the whole cluster silent: a logging gap
        last[vc][cluster == 0] = np.nan
    return Traffic(start, series, last)
