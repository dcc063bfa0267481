"""The failure detector on a real local cluster: a job's iteration reports become verdicts
(`rota health`, `rota job ID`), a hung job's silent ranks stop it and take their GPUs out
of the plan until cleared, a drained node takes no new job while its running one goes on,
and an applied re-plan checkpoints a job that restarts with the new layout (ROTA_LAYOUT)
from its step."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import REPO, RunningCluster, own_cluster, wait_until

from rota.client import job_spec_from_mapping, load_job_file

SLOW_RANK, SLOW_FROM = 5, 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "detector", extra_env={"ROTA_DETECTOR_WARMUP": "30"})


def _spec(file: str, **changes: Any) -> Any:
    return job_spec_from_mapping({"tenant": "demo", **load_job_file(REPO / "examples" / file), **changes}, base_dir=REPO)


def test_a_report_stream_reaches_verdicts_and_a_hung_job_is_stopped(cluster: RunningCluster) -> None:
    command = ["python", "examples/pipeline_job.py", "--iterations", "400", "--slow-rank", str(SLOW_RANK),
               "--slow-factor", "1.3", "--slow-from", str(SLOW_FROM), "--hang-at", "120", "--pace", "0.02"]
    with cluster.client() as client:
        job = client.submit(spec=_spec("pipeline.yaml", command=command))
    # 1. Fail-slow: the slow rank, and only it, in `rota health` and `rota job ID`.
    slow = wait_until(lambda: [v for v in cluster.cli_json("health", "--job", job.id)["verdicts"] if v["kind"] == "slow"],
                  90, "a slow verdict")
    assert [(v["rank"], v["job_id"]) for v in slow] == [(SLOW_RANK, job.id)]
    assert slow[0]["iteration"] >= SLOW_FROM and slow[0]["ratio"] == pytest.approx(1.3, rel=0.05)
    assert slow[0]["evidence"]["stage"] == 2 and len(slow[0]["evidence"]["rank_ratios"]) == 5
    shown = cluster.cli_json("job", job.id)
    assert any(v["kind"] == "slow" and v["rank"] == SLOW_RANK for v in shown["verdicts"])
    text = cluster.cli("job", job.id).stdout
    assert f"rank {SLOW_RANK} (stage 2, replica 0) slow: 1.3" in text
    # 2. Fail-stop: after iteration 120 the job goes quiet; its ranks are declared dead and
    #    the job (restart: never) fails with the reason, and its process is stopped.
    failed = cluster.wait_job(job.id, ("FAILED",), timeout_s=60)
    assert "missed heartbeats" in failed.reason
    kinds = {v["kind"] for v in cluster.cli_json("job", job.id)["verdicts"]}
    assert kinds == {"slow", "stop"}
    health_text = cluster.cli("health").stdout
    assert job.id in health_text and "missed heartbeats" in health_text
    # 3. The dead ranks' GPUs (ranks 0 and 1 ran on the job's two) leave the plan: a 2-GPU
    #    job goes to the other node, the next one waits, and runs there once they are cleared.
    bad = cluster.cli_json("health")["bad_devices"]
    assert sorted((d["node"], d["gpu"], d["job_id"]) for d in bad) == [(failed.node, 0, job.id), (failed.node, 1, job.id)]
    assert "Out of the plan until cleared" in cluster.cli("health").stdout
    sleep = ["python", "examples/sleep_job.py", "--seconds", "120"]
    with cluster.client() as client:
        first = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        assert cluster.wait_job(first.id, ("RUNNING",), timeout_s=60).node != failed.node
        second = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        time.sleep(3)  # many scheduling cycles: the only free GPUs are the bad ones
        assert client.get_job(second.id).state == "PENDING"
        cleared = cluster.cli_json("health", "--clear", f"{failed.node}:0", "--clear", f"{failed.node}:1",
                                   "--reason", "checked")["cleared"]
        assert sorted(d["gpu"] for d in cleared) == [0, 1] and cluster.cli_json("health")["bad_devices"] == []
        assert cluster.wait_job(second.id, ("RUNNING",), timeout_s=60).node == failed.node
        for j in (first, second):
            client.cancel(j.id)


def test_a_drained_node_takes_no_new_job_while_its_running_job_goes_on(cluster: RunningCluster) -> None:
    sleep = ["python", "examples/sleep_job.py", "--seconds", "120"]
    with cluster.client() as client:
        first = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        node = cluster.wait_job(first.id, ("RUNNING",), timeout_s=60).node
        drained = cluster.cli_json("drain", node)
        assert (drained["health"], drained["running_jobs"]) == ("DRAINING", 1)
        assert {n["name"]: n["health"] for n in cluster.cli_json("nodes")}[node] == "DRAINING"
        second = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        other = cluster.wait_job(second.id, ("RUNNING",), timeout_s=60).node
        assert other != node
        third = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        time.sleep(3)  # many scheduling cycles: the drained node has no free GPUs for it either way,
        assert client.get_job(third.id).state == "PENDING"
        client.cancel(second.id)  # ... so free the other node: the third job goes there, not to the drained one
        assert cluster.wait_job(third.id, ("RUNNING",), timeout_s=60).node == other
        assert client.get_job(first.id).state == "RUNNING" and client.get_job(first.id).node == node
        client.cancel(first.id)
        time.sleep(2)  # the drained node is now empty and still gets nothing
        fourth = client.submit(spec=_spec("sleep.yaml", gpus=2, command=sleep))
        time.sleep(3)
        assert client.get_job(fourth.id).state == "PENDING"
        assert cluster.cli_json("drain", node, "--undo")["health"] == "ALIVE"
        assert cluster.wait_job(fourth.id, ("RUNNING",), timeout_s=60).node == node
        for j in (third, fourth):
            client.cancel(j.id)


def test_an_applied_replan_restarts_the_job_from_its_step_with_the_new_layout(
    cluster: RunningCluster, tmp_path: Path,
) -> None:
    starts = tmp_path / "starts.jsonl"
    command = ["python", "examples/pipeline_job.py", "--iterations", "400", "--slow-rank", str(SLOW_RANK),
               "--slow-factor", "1.3", "--slow-from", "40", "--pace", "0.05", "--checkpoint", "--layout-out", str(starts)]
    with cluster.client() as client:
        refused = client.submit(spec=_spec("pipeline.yaml", command=command[:8], accepts_layout_changes=False))
        job = client.submit(spec=_spec("pipeline.yaml", command=command, accepts_layout_changes=True))
    # A job that did not declare it accepts layout changes keeps its layout; the refusal names the flag.
    cluster.wait_job(refused.id, ("RUNNING",), timeout_s=60)
    no = cluster.cli("replan", refused.id, "--apply", check=False)
    assert no.returncode != 0 and "accepts_layout_changes" in no.stderr
    cluster.cli("cancel", refused.id)
    wait_until(lambda: [v for v in cluster.cli_json("health", "--job", job.id)["verdicts"] if v["kind"] == "slow"],
           90, "a slow verdict")
    applied = cluster.cli_json("replan", job.id, "--apply", "--wait", "60")
    assert applied["applied"] and applied["step"] > 40 and applied["image_id"] and applied["node"]
    layout = applied["applied_layout"]
    assert layout["layers_per_stage"] == applied["layers_per_stage"] and layout["device_speeds"][SLOW_RANK] < 0.9
    slow_stage = next(st for st in layout["stages"] if SLOW_RANK in st["ranks"])
    assert slow_stage["layers"] < layout["layers"] // layout["pp"]  # the slow rank's stage sheds layers
    # The restarted job read ROTA_LAYOUT (exactly what the detector stored) and went on from its step.
    seen = wait_until(lambda: len(lines := starts.read_text().splitlines()) >= 2 and [json.loads(x) for x in lines], 60,
                  "the restart")
    first, restarted = seen[0], seen[1]
    assert (first["start"], first["layout"]) == (0, None)
    assert restarted["start"] == applied["step"] and restarted["layout"] == layout
    assert restarted["epoch"] > first["epoch"] and layout["from_epoch"] == first["epoch"]
    done = cluster.wait_job(job.id, timeout_s=180)
    assert done.state == "SUCCEEDED", done.reason
    assert [h.to_state for h in done.history].count("PAUSED") == 1
    assert any(i["step"] == applied["step"] for i in cluster.cli_json("checkpoints", job.id)["images"])
