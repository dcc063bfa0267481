"""Tenant quotas and users on a real local cluster (4 GPUs, the `fast` policy), real PyTorch jobs:

- two tenants with guarantees and limits under more demand than GPUs: the borrower's job
  (with a checkpoint image) is paused when the owner comes back within its guarantee, the
  owner's job starts within the reclaim bound of docs/tenants.md, and the borrower resumes
  from its image with the losses of an uninterrupted run;
- a job over its tenant's limit waits, and `rota explain` says so (`limit`);
- a user's token: its jobs carry its name (`rota jobs --mine`, `rota usage --by user`), and
  once revoked it is refused at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, reference, wait_lines

pytestmark = pytest.mark.e2e

LM = ["python", "examples/train_lm.py", "--steps", "50", "--seed", "7", "--report-every", "5"]
SLEEP = ["python", "examples/sleep_job.py", "--seconds"]
# docs/tenants.md, "The reclaim bound": a plan (ROTA_SCHEDULE_INTERVAL 0.5 s + planning) + the
# borrower's pause (ROTA_CHECKPOINT_TIMEOUT 10 s + the 10 s exit grace) + the next plan and launch.
RECLAIM_BOUND_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    env = {"ROTA_POLICY": "fast", "ROTA_FULL_INTERVAL": "0"}
    yield from own_cluster(tmp_path_factory, databases, redis_url, "quotas", nodes=1, gpus_per_node=4, extra_env=env)


@pytest.mark.timeout(600)  # four real jobs, a checkpoint, a pause and a resume on a shared 2-core machine
def test_a_borrower_is_paused_for_the_owners_guarantee_and_resumes_without_loss(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    cluster.cli("tenants", "add", "vision", "--guaranteed", "1", "--limit", "3")
    cluster.cli("tenants", "add", "nlp", "--guaranteed", "3", "--limit", "4")
    want = reference(LM, tmp_path / "ref.txt")
    losses = tmp_path / "hog.txt"
    # vision borrows: three GPUs against a guarantee of one (its limit).
    hog = cluster.submit_job("hog", tenant="vision", command=[*LM, "--step-delay", "0.4", "--losses", str(losses)],
                             preemptible=True, restart="never")
    fillers = [cluster.submit_job(f"v{i}", tenant="vision", command=[*SLEEP, "600"], preemptible=True) for i in (2, 3)]
    for job in (hog, *fillers):
        cluster.wait_job(job, ("RUNNING",))
    over = cluster.submit_job("v4", tenant="vision", command=[*SLEEP, "2"], preemptible=True)
    held = cluster.wait_job(over, ("PENDING",), reason="at its limit", timeout_s=60)
    assert held.reason.startswith("waits: tenant vision at its limit 3"), held.reason
    assert "limit" in cluster.cli("explain", over).stdout
    nlp_first = cluster.submit_job("n1", tenant="nlp", command=[*SLEEP, "600"], preemptible=True)
    cluster.wait_job(nlp_first, ("RUNNING",))  # the last free GPU: 4 of 4 in use
    listed = {t["name"]: t for t in cluster.cli_json("tenants")}
    assert (listed["vision"]["guaranteed"], listed["vision"]["limit"], listed["vision"]["in_use"],
            listed["vision"]["borrowed"]) == (1, 3, 3, 2)
    wait_lines(losses, 5)
    cluster.cli("checkpoint", hog)  # its image: what makes it pausable

    # nlp returns within its guarantee (2 of 3): vision's pausable borrower is reclaimed.
    asked = time.monotonic()
    owner = cluster.submit_job("n2", tenant="nlp", command=[*SLEEP, "3"], preemptible=True)
    started = cluster.wait_job(owner, ("RUNNING", "SUCCEEDED"), timeout_s=120)
    took = time.monotonic() - asked
    print(f"owner's job started {took:.1f}s after submission (bound {RECLAIM_BOUND_S:.0f}s)")
    assert took <= RECLAIM_BOUND_S, (took, started.reason)
    paused = cluster.client().get_job(hog)
    reasons = " ".join(h.reason for h in paused.history)
    assert "PAUSED" in [h.to_state for h in paused.history] and f"reclaims them for {owner}" in reasons, reasons
    assert cluster.wait_job(owner).state == "SUCCEEDED"

    done = cluster.wait_job(hog, timeout_s=420)
    assert done.state == "SUCCEEDED", done.reason
    assert losses.read_text().splitlines() == want  # paused and resumed, not restarted
    assert cluster.wait_job(over).state == "SUCCEEDED"  # the limit held it, never lost it
    for job in (*fillers, nlp_first):
        cluster.cli("cancel", job)


def test_a_users_jobs_carry_its_name_and_its_revoked_token_is_refused_at_once(cluster: RunningCluster) -> None:
    cluster.cli("tenants", "add", "audio")
    ada = cluster.cli_json("users", "add", "ada", "--tenant", "audio")
    job = cluster.submit_job("mine", tenant="audio", command=[*SLEEP, "1"])  # the admin's: no user
    with cluster.client(ada["token"]) as client:
        from rota.client import job_spec_from_mapping

        spec = job_spec_from_mapping({"name": "ada-job", "kind": "training", "gpus": 1, "command": [*SLEEP, "1"]})
        own = client.submit(spec=spec).id
    assert [j["id"] for j in cluster.cli_json("jobs", "--mine", token=ada["token"])] == [own]
    assert cluster.wait_job(own).user == "ada" and cluster.wait_job(job).user == ""
    rows = cluster.cli("jobs", "--tenant", "audio").stdout
    assert "ada" in rows
    cluster.cli("users", "revoke", "ada", "--tenant", "audio")
    refused = cluster.cli("jobs", token=ada["token"], check=False)
    assert refused.returncode != 0 and "UNAUTHENTICATED" in (refused.stderr + refused.stdout).upper()
    users = cluster.cli_json("users", "list", "--tenant", "audio")
    assert users[0]["name"] == "ada" and users[0]["revoked_at"] and users[0]["last_used_at"]
