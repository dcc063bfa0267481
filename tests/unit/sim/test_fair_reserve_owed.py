"""`fair`'s starving reservation goes only to a job still owed (F_j < 1), the same rule that
lets a starving job displace borrowers (rota.core.fairness.twostage.fair_job_key); before,
it went to the oldest job waiting past the threshold, owed or not (Fair(reserve_owed=False))."""

from __future__ import annotations

import pytest

from rota.sim.engine import SimConfig, Simulator
from rota.sim.orderings import Fair, _to_reserve
from rota.sim.workload import Job

HOUR = 3600.0
STARVE = 4 * HOUR  # FairnessConfig's default threshold


def _waiting(held_a_s: float, held_b_s: float) -> Simulator:
    """8 GPUs, tenants A and B of quota 4. A's 2-GPU job `a` queued at t=0, B's 2-GPU job
    `b` at t=100; each has held GPUs for `held_*_s` before (D_j grows 2 GPU-s per second
    since its submit, so `a` has had its due at 5 h once it has held them over 5 h)."""
    jobs = [Job("a", "A", 0.0, 10 * HOUR, 2), Job("b", "B", 100.0, 10 * HOUR, 2)]
    sim = Simulator(jobs, {"A": 1.0, "B": 1.0}, SimConfig(gpus=8), Fair())
    for r, held in zip(sim.runs, (held_a_s, held_b_s), strict=True):
        sim._arrive(r, r.job.submit_s)
        r.held_s = held
    return sim


@pytest.mark.parametrize(
    ("case", "held_a_s", "held_b_s", "now", "owed", "expected"),
    [
        ("oldest is owed", 0.0, 0.0, 5 * HOUR, True, "a"),
        ("oldest had its due: the next owed one", 6 * HOUR, 0.0, 5 * HOUR, True, "b"),
        ("rule before: the oldest, owed or not", 6 * HOUR, 0.0, 5 * HOUR, False, "a"),
        ("the owed one has not waited long enough", 6 * HOUR, 0.0, STARVE + 50.0, True, None),
        ("rule before, same instant", 6 * HOUR, 0.0, STARVE + 50.0, False, "a"),
        ("both had their due", 6 * HOUR, 6 * HOUR, 5 * HOUR, True, None),
        ("nobody waited long enough", 0.0, 0.0, STARVE - 1.0, True, None),
    ],
)
def test_a_reservation_goes_to_the_oldest_job_still_owed(
    case: str, held_a_s: float, held_b_s: float, now: float, owed: bool, expected: str | None
) -> None:
    sim = _waiting(held_a_s, held_b_s)
    got = _to_reserve(sim, now, set(), owed)
    assert (got.job.id if got is not None else None) == expected, case


def test_fair_reserves_only_for_owed_jobs_by_default() -> None:
    assert Fair().reserve_owed is True
