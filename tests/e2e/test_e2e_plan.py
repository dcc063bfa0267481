"""The live allocator plans the horizon, starts step 0, explains waits and scales realtime apps."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import REPO, RunningCluster, own_cluster

from rota.client import job_spec_from_mapping, load_job_file

STEP_S = 3  # short plan steps, so a demand curve changes within the test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "plan", extra_env={"ROTA_PLAN_STEP": str(STEP_S)})


def _spec(file: str, **changes: Any) -> Any:
    data = {"tenant": "demo", **load_job_file(REPO / "examples" / file), **changes}
    return job_spec_from_mapping(data, base_dir=REPO)


def test_two_blocks_run_and_a_third_waits_with_the_step_it_is_planned_at(cluster: RunningCluster) -> None:
    command = ["python", "examples/sleep_job.py", "--seconds", "60"]
    with cluster.client() as client:
        jobs = [client.submit(spec=_spec("sleep.yaml", gpus=2, command=command, duration="20s")) for _ in range(3)]
        running = [cluster.wait_job(j.id, ("RUNNING",), timeout_s=60).id for j in jobs[:2]]
        waiting = cluster.wait_job(jobs[2].id, ("PENDING",), timeout_s=30, reason="planned at step")
        assert "planned at step" in waiting.reason and "after" in waiting.reason, waiting.reason
        plan = cluster.cli_json("plan")
        cells = {c for row in plan["grid"] for c in row}
        assert set(running) <= cells and jobs[2].id in cells
        by_id = {j["job_id"]: j for j in plan["jobs"]}
        # Running (-1), or started by this very step (0) when no step has passed since.
        assert {by_id[j]["start_step"] for j in running} <= {-1, 0}
        assert by_id[jobs[2].id]["start_step"] >= 1
        assert len(plan["gpu_labels"]) == len(plan["grid"]) == 4
        # Another tenant sees the same grid with demo's jobs masked.
        other = cluster.cli_json("tenants", "add", "plan-other")
        masked = cluster.cli_json("plan", token=other["token"])
        assert {c for row in masked["grid"] for c in row} <= {"", "*"} and masked["jobs"] == []
        assert not any(j.id in masked["trigger"] for j in jobs), masked["trigger"]  # "arrival of j-..." masked too
        # The owner's token reads its own jobs' ids in the trigger, even one that left the plan.
        own = cluster.cli_json("plan", token=cluster.demo_token)
        assert "*" not in own["trigger"] and "another tenant's job" not in own["trigger"], own["trigger"]
        # And `rota nodes`: who holds each GPU, another tenant's job as "*".
        holders = {g["job"] for n in cluster.cli_json("nodes", token=other["token"]) for g in n["gpus"]}
        assert set(running).isdisjoint(holders) and "*" in holders, holders
        assert set(running) <= {g["job"] for n in cluster.cli_json("nodes") for g in n["gpus"]}  # the admin sees all
        text = cluster.cli("plan").stdout
        assert "node-1/0" in text and running[0] in text
        # Asking before submitting: a fourth 2-GPU block waits like the third; nothing is stored.
        before = len(client.list_jobs())
        answer = cluster.cli_json("submit", str(REPO / "examples" / "train-2gpu.yaml"), "--what-if",
                                  token=cluster.demo_token)
        assert answer["start_step"] >= 1 and answer["expected_start_seconds"] == answer["start_step"] * STEP_S
        assert "planned at step" in answer["reason"]
        assert len(client.list_jobs()) == before
        bad = cluster.cli("submit", str(REPO / "examples" / "train-2gpu.yaml"), "--what-if", "--tenant", "nobody",
                          check=False)
        assert bad.returncode != 0 and "tenant" in bad.stderr
        for j in jobs:
            client.cancel(j.id)


def _row(text: str, job_id: str) -> list[str]:
    """The fields of `job_id`'s row in a CLI table ([] if it has none)."""
    return next((line.split() for line in text.splitlines() if line.startswith(job_id + " ")), [])


def test_a_realtime_app_is_scaled_up_and_down_through_its_agent(cluster: RunningCluster) -> None:
    spec = _spec("serve.yaml", demand=[1, 2], max_swap=1, command=["python", "examples/serve_lm.py", "--seconds", "60"])
    with cluster.client() as client:
        app = client.submit(spec=spec)
        cluster.wait_job(app.id, ("RUNNING",), timeout_s=60)
        seen: set[int] = set()
        epochs: set[int] = set()
        # What `rota plan` (start, gpus) and `rota jobs` (GPUS) show for the app, and the plans' triggers.
        plan_gpus: set[str] = set()
        jobs_gpus: set[str] = set()
        triggers: set[str] = set()
        deadline = time.monotonic() + 8 * STEP_S + 20
        while time.monotonic() < deadline and not ({1, 2} <= seen and len(epochs) >= 3 and "2" in plan_gpus
                                                   and "2" in jobs_gpus and any(t.startswith("step began") for t in triggers)):
            progress = client.get_job(app.id).progress
            if "replicas" in progress:
                seen.add(int(progress["replicas"]))
                epochs.add(int(progress["epoch"]))
            plan_text = cluster.cli("plan").stdout
            triggers.add(plan_text.splitlines()[0].partition("(")[2].rpartition(")")[0])
            row = _row(plan_text, app.id)  # job tenant kind start gpus node [indices]...
            if row:
                plan_gpus.add(row[4])
            jobs_text = cluster.cli("jobs").stdout
            row = _row(jobs_text, app.id)  # ID NAME TENANT USER KIND PRIO GPUS ...
            if row:
                jobs_gpus.add(row[jobs_text.splitlines()[0].split().index("GPUS")])
            time.sleep(0.3)
        client.cancel(app.id)
    assert {1, 2} <= seen, f"replica counts seen: {seen}"
    assert len(epochs) >= 3, f"every resize is fenced by a new epoch: {epochs}"
    # Two replicas hold two GPUs: both tables count them (the spec's one GPU per replica is not the count).
    assert "2" in plan_gpus and "2" in jobs_gpus, (plan_gpus, jobs_gpus)
    # A new step's trigger is its wall time, never the step's absolute number.
    began = [t for t in triggers if t.startswith("step began at ")]
    assert began and all(re.fullmatch(r"step began at \d\d:\d\d:\d\d UTC", t) for t in began), triggers
    assert not any(re.search(r"step \d+ began", t) for t in triggers), triggers


def test_a_finished_job_shows_its_planned_beside_its_actual_duration_and_teaches_the_forecaster(
    cluster: RunningCluster,
) -> None:
    spec = _spec("train-small.yaml", command=["python", "examples/train_lm.py", "--steps", "40"])
    with cluster.client() as client:
        before = client.forecast(spec=spec).observations
        job = client.submit(spec=spec)
        assert cluster.wait_job(job.id, timeout_s=120).state == "SUCCEEDED"
        shown = cluster.cli_json("job", job.id)["duration"]
        assert shown["planned_seconds"] > 0 and shown["model"] and shown["actual_seconds"] > 0
        assert shown["declared_seconds"] == 120.0
        # The forecaster's collector observes the completion: the models learn from it.
        deadline = time.monotonic() + 30
        while client.forecast(spec=spec).observations <= before and time.monotonic() < deadline:
            time.sleep(0.5)
        again = client.forecast(spec=spec)
        assert again.observations > before
        # The same job file has run once: its next run is forecast from that run, not the prior.
        assert again.model == "own-runs"
        assert again.p50_seconds == pytest.approx(shown["actual_seconds"], rel=0.1)
