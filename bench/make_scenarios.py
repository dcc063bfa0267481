"""Make the seven allocator benchmark scenarios from the real traces, reproducibly.

    python bench/make_scenarios.py [--seed 7] [--traces ../shared/data/traces] [--out bench/scenarios]

Where each figure comes from (bench/README.md says more):
- training run times: Philly multi-GPU jobs that passed (`philly_multigpu_pass.csv`,
  `run_s`), in whole steps of an hour; many run past the 24-step horizon, as in Philly;
- batch inference, quantization and trial run times: a log-normal with Philly's median
  (874 s) and mean (18,006 s) GPU-job run time (`acme_cluster_summary.csv`), since the
  traces carry no job kinds;
- GPU counts and arrival times: a 24-hour window of one busy Philly VC
  (`philly_vc_arrivals_gavel.csv`), GPU counts rounded up to a power of two and capped;
  a backlog (jobs queued before the plan) arrives at step 0;
- realtime demand: one real day of one Helios Earth VC's hourly GPU demand
  (running + pending, `helios_earth_vc_demand_1min.csv.gz`), its range mapped onto the
  app's trough..peak GPUs;
- priorities: a skewed 1..10 spread (most jobs 3-6, few 9-10); no public trace has them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent.parent / "shared" / "data" / "traces"
BUSY_VCS = ("6214e9", "6c71a0", "b436b2", "ee9e8c")  # 40-67 arrivals a day
SHAPE_VCS = ("vc8Sj", "vchbv", "vcdI0", "vccaA")  # pronounced daily swing
PRIORITY_WEIGHTS = [6, 10, 16, 18, 18, 12, 9, 6, 3, 2]  # for priorities 1..10
H = 24


class Traces:
    def __init__(self, root: Path) -> None:
        with open(root / "philly_multigpu_pass.csv") as f:
            self.train = [(pow2(int(r["num_gpus"]), 1 << 20), float(r["run_s"])) for r in csv.DictReader(f)]
        self.arrivals: dict[str, list[tuple[float, int]]] = defaultdict(list)
        with open(root / "philly_vc_arrivals_gavel.csv") as f:
            for r in csv.DictReader(f):
                self.arrivals[r["vc"]].append((float(r["arrival_s"]), int(r["num_gpus"])))
        with open(root / "acme_cluster_summary.csv") as f:
            philly = next(r for r in csv.DictReader(f) if r["id"] == "Philly")
        median, mean = float(philly["med_run_time_gpu"]), float(philly["avg_run_time_gpu"])
        self.short_mu, self.short_sigma = math.log(median), math.sqrt(2 * math.log(mean / median))
        self.days: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 24)
        with gzip.open(root / "helios_earth_vc_demand_1min.csv.gz", "rt") as f:
            for r in csv.DictReader(f):
                if r["vc"] in SHAPE_VCS:
                    day = self.days[r["vc"], r["time"][:10]]
                    day[int(r["time"][11:13])] += float(r["running_gpu_num"]) + float(r["pending_gpu_num"])


def pow2(n: int, cap: int) -> int:
    return min(cap, 1 << max(0, n - 1).bit_length())


class Maker:
    def __init__(self, traces: Traces, seed: int) -> None:
        self.t = traces
        self.rng = random.Random(seed)

    def window(self, n: int, backlog: int) -> list[tuple[int, int]]:
        """(arrival step, Philly GPU count) for n jobs of one busy VC's 24-hour window.

        Jobs are a random sample of that day, so the GPU-count mix is the VC's own; the
        first `backlog` were queued before the plan and arrive at step 0, the rest keep
        their real offsets into the window in whole steps.
        """
        while True:
            jobs = self.t.arrivals[self.rng.choice(BUSY_VCS)]
            w = self.rng.choice(jobs)[0]
            inside = [(a, g) for a, g in jobs if w <= a < w + H * 3600]
            if len(inside) >= n:
                picked = self.rng.sample(inside, n)
                early = [(0, g) for _, g in picked[:backlog]]
                return early + sorted((int((a - w) // 3600), g) for a, g in picked[backlog:])

    def training(self, cap: int) -> tuple[int, int]:
        """(GPUs, steps) of a real passed Philly multi-GPU job that fits under `cap`."""
        gpus, seconds = self.rng.choice([row for row in self.t.train if row[0] <= cap])
        return gpus, max(1, math.ceil(seconds / 3600))

    def short(self) -> int:
        return max(1, math.ceil(self.rng.lognormvariate(self.t.short_mu, self.t.short_sigma) / 3600))

    def priority(self) -> int:
        return self.rng.choices(range(1, 11), PRIORITY_WEIGHTS)[0]

    def demand(self, trough: int, peak: int) -> list[int]:
        keys = sorted(self.t.days)
        day = self.t.days[self.rng.choice(keys)]
        lo, hi = min(day), max(day)
        start = self.rng.randrange(24)  # the plan starts at some hour of that day
        day = day[start:] + day[:start]
        return [round(trough + (peak - trough) * (v - lo) / max(hi - lo, 1e-9)) for v in day]

    def batch(self, n: int, kinds: list[tuple[str, float]], cap: int, backlog: int,
              priority: Callable[[], int] | None = None) -> list[dict[str, Any]]:
        names, weights = zip(*kinds, strict=True)
        caps = {"training": cap, "batch_inference": min(cap, 4), "quantization": 2, "trial": 1}
        out: list[dict[str, Any]] = []
        for i, (arrival, g) in enumerate(self.window(n, backlog)):
            kind = self.rng.choices(names, weights)[0]
            gpus, steps = self.training(cap) if kind == "training" else (pow2(g, caps[kind]), self.short())
            j = {"id": f"{kind[:2]}-{i}", "kind": kind, "tenant": f"t{self.rng.randrange(4)}",
                 "priority": (priority or self.priority)(), "gpus": gpus, "duration": steps, "arrival": arrival}
            out.append(j)
        return out

    def pin(self, jobs: list[dict[str, Any]], gpus: int, count: int) -> None:
        """Mark `count` backlog jobs as already running, on free aligned blocks."""
        used: set[int] = set()
        for j in [j for j in jobs if j["arrival"] == 0][:count]:
            if j["duration"] < 2:
                continue
            blocks = [f for f in range(0, gpus, j["gpus"]) if not used & set(range(f, f + j["gpus"]))]
            if blocks:
                first = self.rng.choice(blocks)
                used |= set(range(first, first + j["gpus"]))
                j["running"] = {"started": -self.rng.randrange(1, j["duration"]), "first_gpu": first}

    def realtime(self, name: str, trough: int, peak: int, swap: int) -> dict[str, Any]:
        return {"id": name, "kind": "realtime", "tenant": "prod", "priority": 10,
                "demand": self.demand(trough, peak), "max_swap": swap}


def scenario(name: str, gpus: int, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "gpus_per_node": min(8, gpus), "horizon": H, "step_seconds": 3600,
            "decay": 0.97, "realtime_penalty": 8.0, "jobs": jobs}


def make_all(traces: Traces, seed: int) -> list[dict[str, Any]]:
    m = Maker(traces, seed)
    train = [("training", 1.0)]
    mixed = [("training", 0.45), ("batch_inference", 0.35), ("quantization", 0.2)]
    out = []

    jobs = m.batch(10, train, 4, backlog=5)
    m.pin(jobs, 8, 1)
    out.append(scenario("training-heavy", 8, [m.realtime("chat", 1, 3, 1), *jobs]))

    jobs = m.batch(14, mixed, 8, backlog=7)
    m.pin(jobs, 16, 2)
    out.append(scenario("mixed-control", 16, [m.realtime("chat", 2, 6, 2), *jobs]))

    jobs = m.batch(14, [("batch_inference", 0.6), ("training", 0.4)], 8, backlog=7)
    m.pin(jobs, 16, 2)
    out.append(scenario("inference-surge", 16, [m.realtime("chat", 2, 8, 2), m.realtime("search", 1, 4, 1), *jobs]))

    jobs = m.batch(20, [("batch_inference", 0.4), ("quantization", 0.35), ("training", 0.25)], 4, backlog=14)
    out.append(scenario("batch-backlog", 16, [m.realtime("chat", 1, 4, 2), *jobs]))

    jobs = m.batch(16, [("training", 0.5), ("batch_inference", 0.3), ("trial", 0.2)], 8, backlog=8)
    m.pin(jobs, 16, 4)
    out.append(scenario("fragmented", 16, [m.realtime("chat", 1, 3, 1), *jobs]))

    jobs = m.batch(28, mixed + [("trial", 0.1)], 16, backlog=10)
    m.pin(jobs, 64, 4)
    out.append(scenario("scale", 64, [m.realtime("chat", 4, 12, 4), m.realtime("search", 2, 6, 2), *jobs]))

    jobs = m.batch(16, mixed, 8, backlog=8, priority=lambda: 5)
    m.pin(jobs, 16, 2)
    out.append(scenario("uniform-priority", 16, [m.realtime("chat", 2, 5, 2), *jobs]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=HERE / "scenarios")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for s in make_all(Traces(args.traces), args.seed):
        path = args.out / f"{s['name']}.json"
        lines = ",\n  ".join(json.dumps(j) for j in s["jobs"])
        head = json.dumps({k: v for k, v in s.items() if k != "jobs"})[:-1]
        path.write_text(f'{head}, "jobs": [\n  {lines}\n]}}\n')
        print(f"wrote {path} ({len(s['jobs'])} jobs)")


if __name__ == "__main__":
    main()
