"""Lease yields across cycles: GPUs an earlier cycle gave away (a pause still under way, its
taker not started yet) are not given again. Without that, the taker's tenant counted as
holding nothing and took a second borrower's GPUs for the same want, and the over-quota
tenant fell below its quota (seen live: tests/e2e/test_e2e_fairness_live.py)."""

from __future__ import annotations

import pytest
from builders import queued, running

from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.twostage import JobView, TenantState
from rota.core.planning.liveplan import Horizon, LiveNode
from rota.core.planning.moves import MoveCost, MoveInputs
from rota.core.planning.planner import FairInputs, plan_live

STEP = 60.0
NOW = 1_000_000 * STEP
CFG = FairnessConfig(lease_s=3.0, delay_s=0.0)
PAUSABLE = {j: MoveCost(pause_s=2.0, restore_s=3.0) for j in ("lm", "s1", "s2", "s3")}


def standings(held: dict[str, int]) -> FairInputs:
    quota = {"big": 2, "demo": 1, "small": 1}
    tenants = {t: TenantState(t, q, held.get(t, 0), 0.0, q * 3600.0) for t, q in quota.items()}
    waiting = {j: JobView(j, t, 1, NOW - 10, 0.0, 10.0, NOW - 10) for j, t in
               (("d0", "demo"), ("d1", "demo"), ("m0", "small"))}
    return FairInputs(tenants, waiting, CFG)


@pytest.mark.parametrize(("yielded_to", "busy", "takers"), [
    pytest.param({}, frozenset(), ["d0", "m0"], id="first cycle: big yields its excess of 2, one GPU to each"),
    pytest.param({"lm": "d0"}, frozenset({"lm"}), ["m0"],
                 id="lm still pausing for d0: only small's want is new, big keeps its quota"),
    pytest.param({"lm": "d0", "s1": "m0"}, frozenset({"lm"}), [],
                 id="both wants already served: no one yields again"),
])
def test_gpus_given_by_an_earlier_yield_are_not_given_again(
    yielded_to: dict[str, str], busy: frozenset[str], takers: list[str]
) -> None:
    big = [running(j, "a", (g,), tenant="big", preemptible=True) for g, j in enumerate(("lm", "s1", "s2", "s3"))
           if not (j == "s1" and "s1" in yielded_to)]  # a stopped yielder is off its GPU at once
    jobs = [*big, queued("d0", tenant="demo"), queued("d1", tenant="demo"), queued("m0", tenant="small")]
    held = {"big": sum(j.gpus for j in big)}
    out = plan_live([LiveNode("a", 4)], jobs, Horizon(STEP, 8, NOW), "fair", fair=standings(held),
                    held_back={y: "yielded" for y in yielded_to if y not in busy},
                    moves=MoveInputs(costs=PAUSABLE, busy=busy, yielded_to=yielded_to))
    assert sorted(y.to_job for y in out.yields) == takers
    assert all(y.tenant == "big" for y in out.yields)
