"""Least attained service inside a tenant (rota.core.fairness.twostage.own_yields), in the
core rule and in the simulator's `fair`."""

from __future__ import annotations

from rota.core.fairness.twostage import ATTAINED_TIERS_GPU_S, attained_tier, own_yields
from rota.sim.engine import SimConfig, Simulator
from rota.sim.orderings import Fair
from rota.sim.workload import Job

HOUR = 3600.0


def test_tiers_start_at_one_gpu_hour_and_rise_by_decades() -> None:
    assert attained_tier(0.0) == 0 and attained_tier(HOUR - 1) == 0 and attained_tier(HOUR) == 1
    assert attained_tier(ATTAINED_TIERS_GPU_S[-1] * 10) == len(ATTAINED_TIERS_GPU_S)


def test_running_jobs_yield_most_served_first_and_only_as_many_gpus_as_lower_tiers_wait_for() -> None:
    running = [("a", 1, 2 * HOUR), ("b", 1, 20 * HOUR), ("c", 1, 0.5 * HOUR)]
    assert own_yields(running, [(1, 0.0)]) == ["b"]
    assert own_yields(running, [(1, 0.0), (1, 0.0), (1, 0.0)]) == ["b", "a"]  # c is in tier 0 too
    assert own_yields(running, [(1, 5 * HOUR)]) == ["b"]  # tier 1 waits: only tier 2 yields
    assert own_yields(running, []) == []


def test_a_tenants_short_job_does_not_wait_behind_its_own_long_one() -> None:
    # One tenant, one GPU: a 10-hour job, then a 1-minute job an hour later. Within its
    # quota the long job used to be renewed for ever; now it yields at lease expiry once
    # it has had a GPU-hour, and the short job finishes within the next lease.
    jobs = [Job("long", "lab", 0.0, 10 * HOUR, 1), Job("short", "lab", HOUR, 60.0, 1)]
    cfg = SimConfig(gpus=1, gpus_per_node=1)
    runs = {r.job.id: r for r in Simulator(jobs, {"lab": 1.0}, cfg, Fair()).run()}
    lease = cfg.fairness.lease_s
    assert runs["short"].end_s - runs["short"].job.submit_s <= 2 * lease
    assert len(runs["long"].intervals) == 2  # paused once, resumed
