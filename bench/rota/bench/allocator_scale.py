"""`rota bench allocator --scale`: fast's runtime and full's gain over it, 8 to 8,192 GPUs.

Each size is a synthetic contended scenario (`synthetic`): Philly-like job sizes (most jobs
1-8 GPUs, a tail of 16-, 32- and 64-GPU gangs of whole nodes), long-tailed durations, a
diurnal realtime app, two GPU types and racks of six nodes per switch, so the start masks
and the switch preference are exercised at every size. The `--json` form prints

    {"scale": [{"gpus", "jobs", "fast_ms", "full_s", "full_gain", ...}, ...]}

with fast_ms the median of several runs and full_gain = full's objective / fast's - 1.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
from typing import Any

from rota.core.planning import policy_fast
from rota.core.planning.legality import violations
from rota.core.planning.metrics import measure
from rota.core.planning.scenario import BatchJob, RealtimeApp, Scenario

# (GPUs, jobs): the sizes the policies are held to. The last two are the production scale.
SIZES = ((8, 10), (64, 30), (256, 150), (1024, 500), (4096, 5000), (8192, 20000))
# Philly-trace-like request sizes (Jeon et al., ATC '19): mostly one GPU or one node.
GANG_SIZES = (1, 2, 4, 8, 16, 32, 64)
GANG_WEIGHTS = (45, 10, 13, 22, 5, 3, 2)
RACK_NODES = 6  # nodes behind one switch: not a power of two, so 32/64-GPU blocks can straddle two
FAST_RUNS = 5


def synthetic(gpus: int, jobs: int, seed: int = 0, gpus_per_node: int = 8) -> Scenario:
    """A contended scenario of any size (Philly-like sizes and long-tailed durations).

    Every fourth rack (the second, sixth, ...) holds the newer GPU type; one job in ten asks for it (and is kept to
    one node, since a quarter of a small cluster may hold no bigger block of it). Half the
    gangs must stay under one switch.
    """
    rng = random.Random(seed)
    per_node = min(gpus_per_node, gpus)
    nodes = gpus // per_node
    racks = [n // RACK_NODES for n in range(nodes)]
    types = tuple("h100" if r % 4 == 1 else "a100" for r in racks) if nodes >= 2 * RACK_NODES else ()
    switches = tuple(f"sw{r}" for r in racks)
    batch = []
    for i in range(jobs):
        size = min(rng.choices(GANG_SIZES, GANG_WEIGHTS)[0], max(1, gpus // 2))
        wants: frozenset[str] = frozenset()
        if types and rng.random() < 0.1:
            wants, size = frozenset({"h100"}), min(size, per_node)
        batch.append(BatchJob(
            id=f"j{i}", kind="training", tenant=f"t{i % 4}", priority=rng.randint(1, 10), gpus=size,
            duration=max(1, int(rng.lognormvariate(1.5, 1.2))), arrival=rng.choice([0, 0, rng.randrange(24)]),
            gpu_types=wants, same_switch=size > per_node and rng.random() < 0.5,
        ))
    demand = tuple(max(1, round(gpus / 8 * (1.5 + math.sin(t / 24 * 2 * math.pi)))) for t in range(24))
    chat = RealtimeApp(id="chat", tenant="prod", demand=demand, max_swap=max(1, gpus // 32))
    return Scenario(name=f"synthetic-{gpus}", gpus=gpus, horizon=24, gpus_per_node=per_node, batch=tuple(batch),
                    realtime=(chat,), node_types=types, node_switches=switches)


def row(gpus: int, jobs: int, time_limit: float, seed: int = 0) -> dict[str, Any]:
    """One size: fast over FAST_RUNS runs (median), then full once under `time_limit`."""
    from rota.core.planning import policy_full

    s = synthetic(gpus, jobs, seed)
    times = []
    for _ in range(FAST_RUNS):
        t0 = time.perf_counter()
        fast = policy_fast.plan(s)
        times.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    full = policy_full.plan(s, time_limit=time_limit, seed=seed)
    full_wall = time.perf_counter() - t0
    fast_obj, full_obj = measure(s, fast.grid).objective, measure(s, full.grid).objective
    return {
        "gpus": gpus, "jobs": jobs, "fast_ms": round(statistics.median(times), 1),
        "full_s": time_limit, "full_gain": round(full_obj / fast_obj - 1, 5) if fast_obj else 0.0,
        "fast_runs_ms": [round(t, 1) for t in times], "fast_objective": round(fast_obj, 3),
        "full_objective": round(full_obj, 3), "full_wall_s": round(full_wall, 2),
        "full_method": str(full.stats.get("method", "")),
        "fast_legal": not violations(s, fast.grid), "full_legal": not violations(s, full.grid),
    }


def scale(time_limit: float, as_json: bool = False, sizes: tuple[tuple[int, int], ...] | None = None) -> int:
    rows = []
    if not as_json:
        print(f"{'gpus':>5} {'jobs':>6} {'fast ms':>8} {'full gain':>10} {'full s':>7} {'legal':>6}  method")
    for gpus, jobs in SIZES if sizes is None else sizes:
        r = row(gpus, jobs, time_limit)
        rows.append(r)
        if not as_json:
            legal = "yes" if r["fast_legal"] and r["full_legal"] else "NO"
            print(f"{gpus:5d} {jobs:6d} {r['fast_ms']:8.1f} {r['full_gain']:+10.2%} {r['full_wall_s']:7.1f} "
                  f"{legal:>6}  {r['full_method']}", flush=True)
    if as_json:
        json.dump({"scale": rows}, sys.stdout)
        print()
    return 0
