"""What F means, per job and per tenant (rota.core.fairness.standings): demand only while
a job is runnable, and "n/a" where F does not apply."""

from __future__ import annotations

import pytest

from rota.core.dependencies import cap_reason, held_back, waiting_reason
from rota.core.fairness.standings import (
    JobLife,
    demand_intervals,
    job_fairness_applies,
    job_standings,
)


@pytest.mark.parametrize(("case", "kwargs", "expected"), [
    ("a plain job: submission to its end", dict(created=0, finished=10, started=4, holdable=False, held_now=False),
     ((0, 10),)),
    ("a plain job still waiting: to now", dict(created=0, finished=None, started=None, holdable=False, held_now=False),
     ((0, None),)),
    ("a capped task: from its start", dict(created=0, finished=10, started=6, holdable=True, held_now=False),
     ((6, 10),)),
    ("a capped task held now: none yet", dict(created=0, finished=None, started=None, holdable=True, held_now=True),
     ()),
    ("a capped task released, waiting for GPUs", dict(created=0, finished=None, started=None, holdable=True,
                                                      held_now=False), ((0, None),)),
    ("a capped task cancelled unstarted: never", dict(created=0, finished=10, started=None, holdable=True,
                                                      held_now=False), ()),
    ("paused 3-5, then again from 8 on", dict(created=0, finished=None, started=1, holdable=False, held_now=False,
                                             paused=[(3, 5), (8, None)]), ((0, 3), (5, 8))),
    ("paused after it ended: nothing cut", dict(created=0, finished=4, started=1, holdable=False, held_now=False,
                                               paused=[(6, 7)]), ((0, 4),)),
])
def test_a_job_demands_only_while_it_is_runnable(case: str, kwargs: dict, expected: tuple) -> None:  # type: ignore[type-arg]
    assert demand_intervals(**kwargs) == expected, case


@pytest.mark.parametrize(("state", "deserved", "started", "held_now", "applies"), [
    ("RUNNING", 2.0, True, False, True),
    ("SUCCEEDED", 2.0, True, False, True),
    ("PENDING", 2.0, True, False, True),  # requeued after running: runnable, F reads
    ("PENDING", 2.0, False, False, False),  # never ran: its D and its wait say what it is owed
    ("CANCELLED", 0.0, False, False, False),  # an array task its cap held all its life
    ("PAUSED", 2.0, True, False, False),  # not runnable now
    ("PENDING", 2.0, True, True, False),  # held back by its array's cap or a dependency now
    ("RUNNING", 0.0, True, False, False),  # no demand: nothing to compare with
])
def test_f_applies_to_a_runnable_job_that_ran_and_demanded(
    state: str, deserved: float, started: bool, held_now: bool, applies: bool,
) -> None:
    assert job_fairness_applies(state, deserved, started=started, held_now=held_now) is applies


def test_the_holds_of_a_jobs_own_submission_are_told_from_the_clusters() -> None:
    assert held_back(cap_reason("j-0a1b2c3d4e", 2)) and held_back(waiting_reason("j-ffffffffff", "succeeded"))
    assert not held_back("waiting: planned at step 3, after j-9 ends") and not held_back("")


def test_held_tasks_do_not_dilute_the_share_of_the_one_that_runs() -> None:
    # Quota 4; an array of three 1-GPU tasks with %1: task 0 runs 0-100 s, the others held.
    # Before, each task was active from its submission: the share split three ways and the
    # held ones deserved GPU time they could never use.
    lives = [JobLife("t0", 1, 1.0, 0.0, 100.0, ((0.0, 100.0),)), JobLife("t1", 1, 1.0, 0.0, 100.0, ()),
             JobLife("t2", 1, 1.0, 0.0, 100.0, ())]
    st = job_standings(4, lives, {"t0": 100.0}, 200.0)
    assert st["t0"].deserved == pytest.approx(100.0) and st["t0"].fairness == pytest.approx(1.0)
    assert st["t1"].deserved == 0.0 and st["t2"].deserved == 0.0


def test_a_paused_spell_accrues_no_deserved_share() -> None:
    # One 2-GPU job, quota 4: runnable 0-100 s and 300-400 s, paused between.
    st = job_standings(4, [JobLife("j", 2, 1.0, 0.0, None, ((0.0, 100.0), (300.0, None)))], {"j": 400.0}, 400.0)
    assert st["j"].deserved == pytest.approx(2 * 200.0)

