"""The allocator's own moves on a real local cluster: under `fair`, an over-quota tenant's
job with a checkpoint image yields its GPU at lease expiry by a pause (not a restart), the
under-served tenant's job runs, and the paused job resumes with identical losses.

(Priced preemption under `fast` and `--to` targets: tests/e2e/test_e2e_checkpoint.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, reference, wait_lines

pytestmark = pytest.mark.e2e

LM = ["python", "examples/train_lm.py", "--steps", "60", "--seed", "5", "--report-every", "5"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    fair = {"ROTA_POLICY": "fair", "ROTA_FAIR_LEASE": "1", "ROTA_FAIR_DELAY": "0", "ROTA_LEDGER_INTERVAL": "1",
            "ROTA_FULL_INTERVAL": "0"}
    yield from own_cluster(tmp_path_factory, databases, redis_url, "moves", nodes=1, gpus_per_node=2, extra_env=fair)


def test_under_fair_an_expired_lease_with_an_image_yields_by_a_pause_and_resumes_without_loss(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    cluster.cli("tenants", "add", "poor")
    want = reference(LM, tmp_path / "ref.txt")
    losses = tmp_path / "hog.txt"
    # `demo` takes both GPUs (quota: one each); its training job never restarts, but it can pause.
    hog = cluster.submit_job("hog", tenant="demo", command=[*LM, "--step-delay", "0.4", "--losses", str(losses)],
                 preemptible=True, restart="never")
    cluster.wait_job(hog, ("RUNNING",))
    filler = cluster.submit_job("filler", tenant="demo", command=["python", "examples/sleep_job.py", "--seconds", "300"])
    cluster.wait_job(filler, ("RUNNING",))
    wait_lines(losses, 5)
    cluster.cli("checkpoint", hog)

    poor = cluster.submit_job("poor", tenant="poor", command=["python", "examples/sleep_job.py", "--seconds", "2"])
    paused = cluster.wait_job(hog, ("PAUSED", "PENDING"), timeout_s=60)
    reasons = " ".join(h.reason for h in paused.history)
    assert f"yielded its GPUs to {poor}" in reasons and "paused at step" in reasons, reasons
    assert cluster.wait_job(poor).state == "SUCCEEDED"

    done = cluster.wait_job(hog, timeout_s=180)
    cluster.cli("cancel", filler)
    assert done.state == "SUCCEEDED", done.reason
    assert losses.read_text().splitlines() == want  # paused and resumed, not restarted
    assert [h.to_state for h in done.history].count("PAUSED") == 1
