"""Short bursts borrowing from other borrowers (rota.core.fairness.twostage.burst_borrower),
in the core rule and in the simulator's `fair` (Fair(bursts=True), the default)."""

from __future__ import annotations

import pytest

from rota.core.fairness.twostage import burst_borrower
from rota.sim.engine import SimConfig, Simulator
from rota.sim.orderings import Fair
from rota.sim.workload import Job

HOUR = 3600.0
LEASE = 1800.0


@pytest.mark.parametrize(
    ("used_gpu_s", "left_s", "expected"),
    [
        (0.0, 60.0, True),  # a new one-minute job
        (0.0, LEASE, True),  # ends exactly as the lease would
        (HOUR - 1, 60.0, True),  # still in the lowest attained tier
        (0.0, LEASE + 1, False),  # forecast to outlive the lease: the lender would wait for it
        (HOUR, 60.0, False),  # has had a GPU-hour: not a burst any more
        (10 * HOUR, 0.0, False),
    ],
)
def test_a_burst_is_a_job_in_the_lowest_tier_that_ends_within_a_lease(
    used_gpu_s: float, left_s: float, expected: bool
) -> None:
    assert burst_borrower(used_gpu_s, left_s, LEASE) is expected


def _scenario(burst_s: float, long_gpus: int) -> list[Job]:
    """8 GPUs, quotas 2 (long), 2 (bursty), 4 (idle). At t=0 `long` runs 4 GPUs of long jobs
    and `bursty` four 1-GPU long jobs: both borrow, the cluster is full. At t=100 `bursty`
    submits four 1-GPU jobs of `burst_s` each; every lease expires at 1800 s."""
    jobs = [Job(f"long{i}", "long", 0.0, 10 * HOUR, long_gpus) for i in range(4 // long_gpus)]
    jobs += [Job(f"run{i}", "bursty", 0.0, 10 * HOUR, 1) for i in range(4)]
    jobs += [Job(f"burst{i}", "bursty", 100.0, burst_s, 1) for i in range(4)]
    return jobs


SHARES = {"long": 1.0, "bursty": 1.0, "idle": 2.0}


@pytest.mark.parametrize(
    ("case", "burst_s", "long_gpus", "bursts", "started_at_first_expiry"),
    [
        # The rule: short bursts take the GPUs of the other borrower's expired long job
        # (2 GPUs x 1800 s = 1 GPU-hour attained: tier 1) at the first lease expiry.
        ("short bursts, rule on", 600.0, 2, True, 4),
        # Without it a borrower yields only to what keeps its taker within quota: `bursty`
        # gets its quota's worth (2) by pausing its own jobs, and the rest waits for hours.
        ("short bursts, rule off", 600.0, 2, False, 2),
        # Forecast to outlive the lease: not a burst.
        ("long bursts, rule on", 2 * HOUR, 2, True, 2),
        # The lender's jobs are still in the lowest tier (1 GPU x 1800 s): they keep their GPUs.
        ("lender in tier 0, rule on", 600.0, 1, True, 2),
    ],
)
def test_bursts_borrow_from_a_borrower_that_has_attained_more(
    case: str, burst_s: float, long_gpus: int, bursts: bool, started_at_first_expiry: int
) -> None:
    runs = Simulator(_scenario(burst_s, long_gpus), SHARES, SimConfig(gpus=8), Fair(bursts=bursts)).run()
    first = {r.job.id: r.intervals[0][0] for r in runs}
    # at the first expiry, once the paused jobs' 5 s checkpoints are written
    started = sum(1 for j, t in first.items() if j.startswith("burst") and t <= LEASE + 60)
    assert started == started_at_first_expiry, case


def test_a_bursting_tenant_does_not_pause_its_own_jobs_for_its_burst_beyond_its_quota() -> None:
    # Only what keeps `bursty` within its quota (2 GPUs) may pause its own long jobs; the
    # other two bursts borrow the lender's GPUs.
    runs = {r.job.id: r for r in Simulator(_scenario(600.0, 2), SHARES, SimConfig(gpus=8), Fair()).run()}
    own_paused = sum(1 for i in range(4) if len(runs[f"run{i}"].intervals) > 1)
    lender_paused = sum(1 for r in runs.values() if r.tenant == "long" and len(r.intervals) > 1)
    assert own_paused <= 2 and lender_paused == 1
