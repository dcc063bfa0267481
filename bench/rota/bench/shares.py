"""`rota bench shares [--steps N] [--seed S] [--shares a=1,b=1,c=3] [--json]`: whether the
default `fast` policy honours tenants' shares, with and without the ledger's standings.

A rolling-horizon simulation of the live loop (pure: `plan_live` on plain data, no cluster,
no preemption): two 8-GPU nodes and tenants that each submit a seeded stream of training
jobs at the same rate, together about twice what the cluster runs, so every tenant always
wants more than its quota. Every step the planner runs and its starts are taken. Two arms
see the same jobs: `queue` (fast as before: the queue's order, the standings unread) and
`standing` (fast given each step's standings: quota, GPUs held, U and W so far, as the
ledger reports them; it walks its queue across tenants by `fair`'s stage-1 key).

Printed per tenant and arm, ASTRAEA's F = used / deserved over the run (deserved per step
= min(demand, quota), `rota.core.fairness.ltgf`), the tenant's fraction of the GPU-steps,
then Jain's index over the tenants' F and max |F - 1|. Ours: the rates and job mix below.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from typing import Any

from rota.core.fairness.ltgf import FairnessConfig, jain, quotas, ratio
from rota.core.fairness.twostage import TenantState
from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode
from rota.core.planning.planner import FairInputs, plan_live

STEP_S = 60.0
HORIZON = 16
NODES = (LiveNode("n1", 8), LiveNode("n2", 8))
GPUS = sum(n.gpus for n in NODES)
SIZES = (1, 1, 2, 2, 4)  # GPUs per job; durations 2-12 steps: ours
DURATION_STEPS = (2, 12)


@dataclass
class SimJob:
    id: str
    tenant: str
    gpus: int
    steps: int
    arrival: int
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    ran: int = 0


def workload(seed: int, steps: int, tenants: list[str]) -> list[SimJob]:
    """Each tenant alone would keep the cluster about 2/n busy: together about 2x its GPUs."""
    rng = random.Random(seed)
    mean_gpu_steps = sum(SIZES) / len(SIZES) * sum(DURATION_STEPS) / 2
    rate = 2 * GPUS / mean_gpu_steps / len(tenants)  # jobs per step per tenant
    jobs: list[SimJob] = []
    for t in range(steps):
        for tenant in rng.sample(tenants, len(tenants)):  # who submits first varies step by step
            for _ in range(_poisson(rng, rate)):
                jobs.append(SimJob(f"{tenant}-{len(jobs)}", tenant, rng.choice(SIZES),
                                   rng.randint(*DURATION_STEPS), t))
    return jobs


def _poisson(rng: random.Random, mean: float) -> int:
    n, p, limit = 0, 1.0, pow(2.718281828459045, -mean)
    while True:
        p *= rng.random()
        if p < limit:
            return n
        n += 1


def simulate(jobs: list[SimJob], steps: int, shares: dict[str, float], standings: bool) -> dict[str, Any]:
    run = [SimJob(**vars(j)) for j in jobs]
    quota = quotas(GPUS, shares)
    cfg = FairnessConfig()
    used = dict.fromkeys(shares, 0.0)
    deserved = dict.fromkeys(shares, 0.0)
    for t in range(steps):
        now = t * STEP_S
        active = [j for j in run if j.arrival <= t and j.ran < j.steps]
        live = [LiveJob(j.id, j.tenant, "training", 5, j.gpus, node=j.node, gpu_indices=j.gpu_indices,
                        elapsed_s=j.ran * STEP_S, duration_s=j.steps * STEP_S) for j in active]
        fair = None
        if standings:
            held = {u: sum(j.gpus for j in active if j.tenant == u and j.node) for u in shares}
            fair = FairInputs({u: TenantState(u, quota[u], held[u], used[u] * STEP_S, quota[u] * t * STEP_S,
                                              shares[u]) for u in shares}, {}, cfg)
        out = plan_live(list(NODES), live, Horizon(STEP_S, HORIZON, now), "fast", fair=fair)
        by_id = {j.id: j for j in active}
        for s in out.decision.starts:
            by_id[s.job_id].node, by_id[s.job_id].gpu_indices = s.node, s.gpus
        for u in shares:
            demand = sum(j.gpus for j in active if j.tenant == u)
            deserved[u] += min(demand, quota[u])
        for j in active:
            if j.node is not None:
                used[j.tenant] += j.gpus
                j.ran += 1
                if j.ran >= j.steps:
                    j.node, j.gpu_indices = None, ()
    f = {u: ratio(used[u], deserved[u]) for u in shares}
    total = sum(used.values()) or 1.0
    return {"f": f, "gpu_fraction": {u: used[u] / total for u in shares}, "quota": quota,
            "jain": jain(f.values()), "max_dev": max(abs(x - 1) for x in f.values()),
            "utilisation": total / (GPUS * steps)}


def _shares(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rota bench shares", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shares", default="a=1,b=1,c=3", help="tenant=share,... (default a=1,b=1,c=3)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    shares = _shares(args.shares)
    jobs = workload(args.seed, args.steps, list(shares))
    arms = {arm: simulate(jobs, args.steps, shares, arm == "standing") for arm in ("queue", "standing")}
    if args.json:
        json.dump({"steps": args.steps, "seed": args.seed, "shares": shares, "jobs": len(jobs), "arms": arms},
                  sys.stdout, indent=2)
        print()
        return 0
    print(f"{len(jobs)} jobs, {args.steps} steps, {GPUS} GPUs, seed {args.seed}; F = used / deserved")
    print(f"{'tenant':8} {'share':>5} {'quota':>5} {'F queue':>8} {'F standing':>10} {'GPUs queue':>10} "
          f"{'GPUs standing':>13}")
    q, s = arms["queue"], arms["standing"]
    for u in shares:
        print(f"{u:8} {shares[u]:5g} {q['quota'][u]:5d} {q['f'][u]:8.2f} {s['f'][u]:10.2f} "
              f"{q['gpu_fraction'][u]:10.2f} {s['gpu_fraction'][u]:13.2f}")
    for key in ("jain", "max_dev", "utilisation"):
        print(f"{key:12} queue {q[key]:.3f}  standing {s[key]:.3f}  standing/queue {s[key] / q[key]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
