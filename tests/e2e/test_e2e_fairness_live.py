"""Long-term fairness live (`ROTA_POLICY=fair`, a 3 s lease) on a real local cluster of 4 GPUs:
three tenants of shares 2, 1 and 1 (quotas 2, 1, 1) and more demand than GPUs.

`big` finds the cluster idle and takes all four GPUs: its PyTorch job (with a checkpoint
image) and three sleepers. Then `demo` and `small` queue work. At the next lease expiry big,
two GPUs over its quota, yields two of them (its longest-held lease first: the training job,
paused at a step; then a sleeper, requeued). Over the following leases every tenant's F
moves towards 1 (the standings of `rota fairness`); once the others' work is gone the paused
job resumes from its image and ends with the losses of an uninterrupted run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, reference, wait_lines, wait_until

from rota.client.ledger import Standings

pytestmark = pytest.mark.e2e

LEASE_S = 3
LM = ["python", "examples/train_lm.py", "--steps", "60", "--seed", "11", "--report-every", "5"]
SLEEP = ["python", "examples/sleep_job.py", "--seconds"]
# Where the tenants' F must get to while all three still want more than their quotas: big
# held twice its quota until the first lease expired, so its F (used / deserved) falls
# towards 1 only as time at its quota dilutes that start; 0.5 is reached when the time since
# is about as long as the start was.
CONVERGED = 0.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    env = {"ROTA_POLICY": "fair", "ROTA_FAIR_LEASE": str(LEASE_S), "ROTA_FAIR_DELAY": "0",
           "ROTA_LEDGER_INTERVAL": "1", "ROTA_FULL_INTERVAL": "0"}
    yield from own_cluster(tmp_path_factory, databases, redis_url, "fairlive", nodes=1, gpus_per_node=4,
                           extra_env=env)


def spread(st: Standings) -> float:
    """max |F - 1| over the tenants with demand in the window."""
    return max(abs(t.fairness - 1) for t in st.tenants if t.fairness is not None)


def fairness(st: Standings) -> dict[str, float | None]:
    return {t.tenant: t.fairness for t in st.tenants}


@pytest.mark.timeout(420)  # a real training job, a pause and a resume on a shared 2-core machine
def test_under_fair_each_tenants_f_moves_towards_1_and_the_paused_job_resumes_without_loss(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    began = time.monotonic()
    with ThreadPoolExecutor(1) as pool:  # the uninterrupted run's losses, while the cluster works
        want = pool.submit(reference, LM, tmp_path / "ref.txt")
        check_live_fairness(cluster, tmp_path / "lm.txt")
        assert (tmp_path / "lm.txt").read_text().splitlines() == want.result()  # resumed, not restarted
    print(f"{time.monotonic() - began:.0f}s in all")


def check_live_fairness(cluster: RunningCluster, losses: Path) -> None:
    """The scenario of the module docstring up to the training job's end (its losses in `losses`)."""
    began = time.monotonic()
    cluster.cli("tenants", "add", "big", "--share", "2")
    cluster.cli("tenants", "add", "small")  # `demo` (share 1) is the third
    lm = cluster.submit_job("lm", tenant="big", command=[*LM, "--step-delay", "0.3", "--losses", str(losses)],
                            preemptible=True, restart="never")
    cluster.wait_job(lm, ("RUNNING",))
    sleepers = [cluster.submit_job(f"big{i}", tenant="big", command=[*SLEEP, "600"], preemptible=True,
                                   restart="on-failure") for i in range(3)]
    for job in sleepers:
        cluster.wait_job(job, ("RUNNING",))
    wait_lines(losses, 2)
    cluster.cli("checkpoint", lm)  # its image: what lets it yield by a pause

    # The others arrive with more work than their quotas (1 GPU each).
    others = [cluster.submit_job(f"{t}{i}", tenant=t, command=[*SLEEP, "600"], preemptible=True,
                                 restart="on-failure") for t in ("demo", "small") for i in range(2)]
    paused = cluster.wait_job(lm, ("PAUSED", "PENDING"), timeout_s=60)
    reasons = " ".join(h.reason for h in paused.history)
    assert "paused at step" in reasons and "yielded its GPUs to" in reasons, reasons
    with cluster.client() as client:
        first = wait_until(lambda: (lambda st: st if len([t for t in st.tenants if t.fairness is not None]) == 3
                                    else None)(client.standings()), 30, "standings of all three tenants")
        print(f"{time.monotonic() - began:.0f}s: after the first lease: F {fairness(first)}, max|F-1| {spread(first):.3f}")
        # Every tenant now runs at its quota; F moves towards 1, lease after lease. big's F is
        # kept as it goes: the first standings can come before the ledger has counted big's
        # last seconds at four GPUs (once seen: 1.43 there, 1.49 at convergence), so its lead
        # is judged against the highest F seen, not the first.
        seen: list[float] = []

        def converged(st: Standings) -> Standings | None:
            seen.extend(t.fairness for t in st.tenants if t.tenant == "big" and t.fairness is not None)
            return st if spread(st) <= CONVERGED else None

        last = wait_until(lambda: converged(client.standings()), 90, f"max|F-1| <= {CONVERGED}")
        print(f"{time.monotonic() - began:.0f}s: converged: F {fairness(last)}, max|F-1| {spread(last):.3f}")
        held = {t.tenant: t for t in client.standings().tenants}
    assert spread(last) < spread(first)
    before, after = fairness(first), fairness(last)
    for t in ("demo", "small"):  # the late tenants were owed GPU-time and are being paid it,
        assert (after[t] or 0) > (before[t] or 0), (t, before, after)
        # at their quotas, not beyond: a yield given twice while a pause was under way took
        # big below its quota and gave demo two GPUs (F 1.49 before the fix)
        assert (after[t] or 0) < 1.1, (t, after)
    assert (after["big"] or 0) < max([before["big"] or 0, *seen[:-1]])  # and big's lead shrinks from its peak
    assert {t: held[t].quota for t in ("big", "demo", "small")} == {"big": 2, "demo": 1, "small": 1}
    listed = cluster.cli_json("fairness")
    assert (listed["policy"], listed["lease_seconds"]) == ("fair", LEASE_S)

    # The others' work is cancelled: the paused job resumes from its image.
    for job in others:
        cluster.cli("cancel", job)
    done = cluster.wait_job(lm, timeout_s=240)
    for job in sleepers:
        cluster.cli("cancel", job)
    assert done.state == "SUCCEEDED", done.reason
    states = [h.to_state for h in done.history]
    assert states.count("PAUSED") >= 1, states
