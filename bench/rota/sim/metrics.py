"""Summary figures recomputed from a schedule alone (each job's submit, end, GPUs and
run intervals) plus the tenants' shares and the cluster size, as a reader of the JSON
would: nothing here looks inside the simulator.

- avg JCT: mean(end − submit).
- utilisation: Σ gpus · interval length / (G · (last end − first submit)); checkpoint and
  restore time counts as busy, since the GPUs could not serve anyone else.
- tenant F_u = U_u / D_u over the whole run, U_u = Σ gpus · interval length and
  D_u = ∫ min(demand_u(t), Q_u) dt, demand_u(t) = Σ gpus of its jobs submitted and not
  finished at t. Reported as max F / min F and Jain's index over tenants with D_u > 0
  (ASTRAEA's definition; `tenant_f`, `tenant_f_min`, `tenant_jain`, `tenant_f_max_min`).
- water-filling tenant F^wf_u = U_u / D^wf_u, D^wf_u = ∫ waterfill(G, demand(t), shares)_u dt
  (rota.core.fairness.waterfill: the weighted max-min share of the whole cluster given every
  tenant's demand at t); reported per tenant (`tenant_f_waterfill`), as max F / min F
  (`tenant_waterfill_max_min`) and mean |F − 1| (`tenant_waterfill_mean_dev`).
- job F_j = U_j / D_j with D_j = ∫_submit^end min(n_j, w_j / Σ_active w · Q_u) dt;
  reported as the share of jobs with F_j in [0.95, 1.05] and Jain's index over jobs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rota.core.fairness.ltgf import JobShareClock, jain, quotas, ratio
from rota.core.fairness.waterfill import waterfill


@dataclass(frozen=True)
class JobRecord:
    id: str
    tenant: str
    gpus: int
    submit_s: float
    end_s: float
    intervals: list[list[float]]
    priority: int = 1

    @property
    def held_s(self) -> float:
        return sum(b - a for a, b in self.intervals)


def tenant_fairness(jobs: Sequence[JobRecord], shares: Mapping[str, float], gpus: int) -> dict[str, float]:
    """F_u per tenant with any deserved time (tenants that never submitted are left out)."""
    quota = quotas(gpus, shares)
    out: dict[str, float] = {}
    for t in shares:
        mine = [j for j in jobs if j.tenant == t]
        # Sweep the demand step function: +n at submit, −n at end.
        steps = sorted([(j.submit_s, j.gpus) for j in mine] + [(j.end_s, -j.gpus) for j in mine])
        deserved, demand, last = 0.0, 0, 0.0
        for time, delta in steps:
            deserved += min(demand, quota[t]) * (time - last)
            demand, last = demand + delta, time
        if deserved > 0:
            out[t] = ratio(sum(j.gpus * j.held_s for j in mine), deserved)
    return out


def tenant_fairness_waterfill(jobs: Sequence[JobRecord], shares: Mapping[str, float], gpus: int) -> dict[str, float]:
    """F^wf_u per tenant with any deserved time: used over the integral of the weighted
    max-min share of all G GPUs given every tenant's demand at each instant."""
    steps = sorted([(j.submit_s, j.tenant, j.gpus) for j in jobs] + [(j.end_s, j.tenant, -j.gpus) for j in jobs])
    demand = {t: 0.0 for t in shares}
    deserved = {t: 0.0 for t in shares}
    last = steps[0][0] if steps else 0.0
    for time, tenant, delta in steps:
        if time > last:
            for t, d in waterfill(gpus, demand, shares).items():
                deserved[t] += d * (time - last)
            last = time
        demand[tenant] += delta
    used: dict[str, float] = {t: 0.0 for t in shares}
    for j in jobs:
        used[j.tenant] += j.gpus * j.held_s
    return {t: ratio(used[t], d) for t, d in deserved.items() if d > 0}


def _spread(f: Mapping[str, float]) -> float | None:
    """max F / min F; None when undefined (no tenant owed anything, or one owed and given nothing)."""
    return max(f.values()) / min(f.values()) if f and min(f.values()) > 0 else None


def job_fairness(jobs: Sequence[JobRecord], shares: Mapping[str, float], gpus: int) -> dict[str, float]:
    quota = quotas(gpus, shares)
    clocks = {t: JobShareClock(quota[t]) for t in shares}
    # Replay arrivals and departures in time order; departures first at equal times so a
    # job that ends when another starts does not dilute its share.
    events = sorted(
        [(j.submit_s, 1, k) for k, j in enumerate(jobs)] + [(j.end_s, 0, k) for k, j in enumerate(jobs)]
    )
    out: dict[str, float] = {}
    for time, is_arrival, k in events:
        j = jobs[k]
        if is_arrival:
            clocks[j.tenant].add(time, j.id, j.gpus, j.priority)
        else:
            out[j.id] = ratio(j.gpus * j.held_s, clocks[j.tenant].remove(time, j.id))
    return out


def summarize(jobs: Sequence[JobRecord], shares: Mapping[str, float], gpus: int) -> dict[str, object]:
    if not jobs:
        return {"jobs_done": 0}
    jct = [j.end_s - j.submit_s for j in jobs]
    span = max(j.end_s for j in jobs) - min(j.submit_s for j in jobs)
    busy = sum(j.gpus * j.held_s for j in jobs)
    tf = tenant_fairness(jobs, shares, gpus)
    wf = tenant_fairness_waterfill(jobs, shares, gpus)
    jf = list(job_fairness(jobs, shares, gpus).values())
    return {
        "jobs_done": len(jobs),
        "avg_jct_s": statistics.fmean(jct),
        "median_jct_s": statistics.median(jct),
        "makespan_s": span,
        "utilization": busy / (gpus * span) if span > 0 else 0.0,
        "tenant_f_max_min": _spread(tf),
        "tenant_f_min": min(tf.values()) if tf else None,
        "tenant_jain": jain(tf.values()),
        "tenant_waterfill_max_min": _spread(wf),
        "tenant_waterfill_mean_dev": statistics.fmean(abs(f - 1) for f in wf.values()) if wf else None,
        "job_f_in_band": sum(0.95 <= f <= 1.05 for f in jf) / len(jf),
        "job_jain": jain(jf),
        "preemptions": sum(len(j.intervals) - 1 for j in jobs),
        "tenant_f": {t: round(f, 4) for t, f in sorted(tf.items())},
        "tenant_f_waterfill": {t: round(f, 4) for t, f in sorted(wf.items())},
    }
