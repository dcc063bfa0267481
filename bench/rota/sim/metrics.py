"""Summary figures recomputed from a schedule alone (each job's submit, end, GPUs and
run intervals) plus the tenants' shares and the cluster size, as a reader of the JSON
would: nothing here looks inside the simulator.

- avg JCT: mean(end − submit).
- utilisation: Σ gpus · interval length / (G · (last end − first submit)); checkpoint and
  restore time counts as busy, since the GPUs could not serve anyone else.
- tenant F_u = U_u / D_u over the whole run, U_u = Σ gpus · interval length and
  D_u = ∫ min(demand_u(t), Q_u) dt, demand_u(t) = Σ gpus of its jobs submitted and not
  finished at t. Reported as max F / min F and Jain's index over tenants with D_u > 0.
- job F_j = U_j / D_j with D_j = ∫_submit^end min(n_j, w_j / Σ_active w · Q_u) dt;
  reported as the share of jobs with F_j in [0.95, 1.05] and Jain's index over jobs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rota.core.fairness.ltgf import JobShareClock, jain, quotas, ratio


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
    jf = list(job_fairness(jobs, shares, gpus).values())
    return {
        "jobs_done": len(jobs),
        "avg_jct_s": statistics.fmean(jct),
        "median_jct_s": statistics.median(jct),
        "makespan_s": span,
        "utilization": busy / (gpus * span) if span > 0 else 0.0,
        "tenant_f_max_min": max(tf.values()) / min(tf.values()) if tf and min(tf.values()) > 0 else None,
        "tenant_jain": jain(tf.values()),
        "job_f_in_band": sum(0.95 <= f <= 1.05 for f in jf) / len(jf),
        "job_jain": jain(jf),
        "preemptions": sum(len(j.intervals) - 1 for j in jobs),
        "tenant_f": {t: round(f, 4) for t, f in sorted(tf.items())},
    }
