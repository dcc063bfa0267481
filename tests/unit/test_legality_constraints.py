"""The referee's placement checks: a job's GPU types and a same-switch job's switch."""

from __future__ import annotations

from typing import Any

import pytest
from builders import batch_job

from rota.core.planning.grid import Grid, empty
from rota.core.planning.legality import violations
from rota.core.planning.scenario import Scenario, from_dict

# Four nodes of 2 GPUs: a100, a100, h100, h100; switches s1, s2, s2, s2.
TYPES = ["a100", "a100", "h100", "h100"]
SWITCHES = ["s1", "s2", "s2", "s2"]


def cluster(*jobs: dict[str, Any], types: list[str] | None = TYPES, switches: list[str] | None = SWITCHES) -> Scenario:
    d: dict[str, Any] = {"name": "t", "gpus": 8, "gpus_per_node": 2, "horizon": 2, "jobs": list(jobs)}
    if types is not None:
        d["node_types"] = types
    if switches is not None:
        d["node_switches"] = switches
    return from_dict(d)


def placed(s: Scenario, job_id: str, first: int) -> Grid:
    grid = empty(s.gpus, s.horizon)
    j = s.job(job_id)
    for g in range(first, first + j.gpus):  # type: ignore[union-attr]
        grid[g][0] = job_id
    return grid


CASES = [
    ("a job on a node of a type it accepts is legal",
     cluster(batch_job("j", gpus=2, gpu_types=["h100"])), "j", 4, None),
    ("a job on a node of another type is caught",
     cluster(batch_job("j", gpus=2, gpu_types=["h100"])), "j", 0, "j runs on node 0 (a100 GPUs); it accepts only h100"),
    ("a gang with one node of the wrong type is caught",
     cluster(batch_job("g", gpus=4, gpu_types=["a100"])), "g", 4, "g runs on node 2 (h100 GPUs); it accepts only a100"),
    ("a job that accepts any type may go anywhere",
     cluster(batch_job("j", gpus=2)), "j", 0, None),
    ("types are no constraint where the scenario does not model them",
     cluster(batch_job("j", gpus=2, gpu_types=["h100"]), types=None), "j", 0, None),
    ("a same-switch gang under one switch is legal",
     cluster(batch_job("g", gpus=4, same_switch=True)), "g", 4, None),
    ("a same-switch gang spanning two switches is caught",
     cluster(batch_job("g", gpus=4, same_switch=True)), "g", 0, "g spans 2 switches (s1, s2); it must stay under one"),
    ("a gang that does not ask for one switch may span two",
     cluster(batch_job("g", gpus=4)), "g", 0, None),
    ("switches are no constraint where the scenario does not model them",
     cluster(batch_job("g", gpus=4, same_switch=True), switches=None), "g", 0, None),
]


@pytest.mark.parametrize(("s", "job_id", "first", "problem"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement_checks(s: Scenario, job_id: str, first: int, problem: str | None) -> None:
    assert violations(s, placed(s, job_id, first)) == ([problem] if problem else [])


def test_a_running_job_is_not_judged_on_its_placement_only_on_staying_put() -> None:
    s = cluster(batch_job("r", gpus=2, duration=2, gpu_types=["h100"], running={"started": 0, "first_gpu": 0}))
    grid = empty(s.gpus, s.horizon)
    for g in (0, 1):
        grid[g] = ["r", "r"]
    assert violations(s, grid) == []


def test_the_old_checks_still_come_first() -> None:
    s = cluster(batch_job("j", gpus=2, gpu_types=["h100"]))
    grid = placed(s, "j", 1)  # unaligned, and on an a100 node
    assert violations(s, grid)[0] == "j holds GPUs [1, 2], not an aligned block of 2"
