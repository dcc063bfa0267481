"""Streaming migrations on a real local cluster (two nodes of one GPU slot each), and the
faults a streaming migration must survive: kill -9 of the source agent, of the target agent
and of the checkpoint coordinator while the state is on its way.

The cluster takes no hard links between its nodes' staging folders (ROTA_CHECKPOINT_HANDOFF=0,
as on two machines), caps the background write at 2 MB/s (a slow store) and the streams at
4 MB/s (a busy link), so a migration of the ~20 MB LM below resumes its job on the target
while its image is still being written, and every fault lands mid-stream. Each case checks
what must hold: the job ends SUCCEEDED with the losses of an uninterrupted run, the image is
complete in the end, and no two copies of the job ever ran at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, reference, wait_lines, wait_until
from sqlalchemy import create_engine, text

from rota.bench.fault_harness import Harness, Watch

pytestmark = pytest.mark.e2e

LM = ["python", "examples/train_lm.py", "--steps", "50", "--seed", "11", "--report-every", "5",
      "--d-model", "256", "--step-delay", "0.15"]


# What every agent runs with, a restarted one included (ROTA_NODE_TIMEOUT: start_cluster's).
AGENT_ENV = {"ROTA_CHECKPOINT_HANDOFF": "0", "ROTA_CHECKPOINT_WRITE_MBPS": "2", "ROTA_CHECKPOINT_STREAM_MBPS": "4",
             "ROTA_NODE_TIMEOUT": "3"}
REFERENCE: list[list[str]] = []  # the uninterrupted run's losses, computed once


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    AGENT_ENV["ROTA_STAGING_ROOT"] = str(tmp_path_factory.mktemp("streaming-staging"))
    yield from own_cluster(tmp_path_factory, databases, redis_url, "streaming", nodes=2, gpus_per_node=1,
                           extra_env=AGENT_ENV)


@pytest.fixture(scope="module")
def harness(cluster: RunningCluster) -> Iterator[Harness]:
    """Restarts killed agents; the ones it started stop before the cluster does."""
    restarts = Harness(home=cluster.home)
    try:
        yield restarts
    finally:
        restarts.stop()


def reference_losses(tmp_path: Path) -> list[str]:
    if not REFERENCE:
        REFERENCE.append(reference(LM, tmp_path / "reference"))
    return REFERENCE[0]


def sql(cluster: RunningCluster, query: str, **params: Any) -> list[Any]:
    engine = create_engine(cluster.database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(query), params).all())
    finally:
        engine.dispose()


def running_lm(cluster: RunningCluster, tmp_path: Path) -> tuple[str, str, Path]:
    losses = tmp_path / "losses"
    job_id = cluster.submit_job("lm", [*LM, "--losses", str(losses)], tenant="demo", preemptible=True,
                                restart="on-failure")
    node = cluster.wait_job(job_id, ("RUNNING",), timeout_s=60).node
    wait_lines(losses, 8)  # past its first steps: the image has state worth moving
    return job_id, node, losses


def migrate_in_background(cluster: RunningCluster, job_id: str, target: str) -> threading.Thread:
    """`rota move` as a user runs it; it answers once the image is written, which is later."""
    def call() -> None:
        with cluster.client() as client:
            try:
                client.migrate(job_id, node=target, timeout=timedelta(seconds=15), wait=timedelta(seconds=90))
            except Exception:  # noqa: BLE001 - a fault case may cut the call off; the checks below judge
                pass
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def migration(cluster: RunningCluster, job_id: str) -> tuple[str, str, str]:
    """The job's newest migration: (its state, its image, that image's state)."""
    rows = sql(cluster, """SELECT o.state, o.image_id, i.state FROM checkpoint_operations o
                           JOIN checkpoint_images i ON i.id = o.image_id
                           WHERE o.job_id = :job AND o.kind = 'migrate' ORDER BY o.id DESC LIMIT 1""", job=job_id)
    return tuple(rows[0]) if rows else ("", "", "")  # type: ignore[return-value]


def restoring_on(cluster: RunningCluster, job_id: str, node: str) -> bool:
    """True once the job runs on `node` and its image is not yet written: mid-stream."""
    with cluster.client() as client:
        job = client.get_job(job_id)
    _, _, image_state = migration(cluster, job_id)
    return job.state == "RUNNING" and job.node == node and image_state == "writing"


def finish(cluster: RunningCluster, job_id: str, losses: Path, tmp_path: Path, watch: Watch) -> None:
    done = cluster.wait_job(job_id, timeout_s=240)
    assert done.state == "SUCCEEDED", (done.state, done.reason)
    assert losses.read_text().splitlines() == reference_losses(tmp_path)
    op_state, image, image_state = wait_until(
        lambda: (m := migration(cluster, job_id))[0] in ("done", "failed") and m, 120, "the migration's end")
    assert (op_state, image_state) == ("done", "complete"), image
    assert watch.two_copies == set(), watch.sightings
    assert watch.double_booked == set(), watch.sightings


def other(cluster: RunningCluster, node: str) -> str:
    return next(n for n in cluster.info["agents"] if n != node)


def stream_bytes(cluster: RunningCluster, node: str, via: str) -> float:
    with urllib.request.urlopen(cluster.info["metrics"][node], timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(f'rota_checkpoint_stream_bytes_total{{via="{via}"}}'):
                return float(line.split()[-1])
    return 0.0


def test_a_migrated_job_runs_on_its_target_while_its_image_is_written_its_state_streamed(
        cluster: RunningCluster, tmp_path: Path) -> None:
    with Watch(cluster.home) as watch:
        job_id, source, losses = running_lm(cluster, tmp_path)
        target = other(cluster, source)
        migrate_in_background(cluster, job_id, target)
        wait_until(lambda: restoring_on(cluster, job_id, target), 60, "the job running on the target mid-write")
        with cluster.client() as client:
            job = client.get_job(job_id)
        assert any("as it is written" in h.reason and source in h.reason for h in job.history), job.history
        wait_until(lambda: stream_bytes(cluster, target, "wire") > 0, 60, "the target's streamed bytes")
        log = (cluster.home / "logs" / f"{target}.log").read_text()
        assert f"from {cluster.info['agents'][source]['address']}" in log and "streamed image" in log
        finish(cluster, job_id, losses, tmp_path, watch)
    # The operation says so, in the JSON and the table of `rota checkpoints`.
    ops = cluster.cli_json("checkpoints", job_id)["operations"]
    moved = next(o for o in ops if o["kind"] == "migrate")
    assert moved["streamed"] is True and moved["source_node"] == source and moved["target_node"] == target
    assert moved["pause_seconds"] > 0 and moved["write_seconds"] > 0 and moved["seconds"] >= moved["write_seconds"]
    assert "STREAMED" in cluster.cli("checkpoints", job_id).stdout


def kill_mid_stream(cluster: RunningCluster, harness: Harness, tmp_path: Path, victim: Callable[[str, str], str],
                    restart: Callable[[Harness, str], None]) -> None:
    """Migrates the LM, kills -9 whatever `victim(source, target)` names mid-stream, restarts it
    with `restart`, and checks the job, its image and its copies."""
    with Watch(cluster.home) as watch:
        job_id, source, losses = running_lm(cluster, tmp_path)
        target = other(cluster, source)
        migrate_in_background(cluster, job_id, target)
        wait_until(lambda: restoring_on(cluster, job_id, target), 60, "the job running on the target mid-write")
        name = victim(source, target)
        os.kill(harness.agent_pid(name) if name in cluster.info["agents"] else cluster.info["pids"][name],
                signal.SIGKILL)
        restart(harness, name)
        finish(cluster, job_id, losses, tmp_path, watch)


def restart_agent(harness: Harness, node: str) -> None:
    time.sleep(0.5)  # down for a moment, as after a crash
    harness.restart_agent(node, extra_env=AGENT_ENV)


def restarted_by_rota_up(harness: Harness, name: str) -> None:
    old = harness.info["pids"][name]
    wait_until(lambda: harness.info["pids"][name] != old, 60, f"rota up restarting {name}")


def test_kill_9_of_the_source_agent_mid_stream_loses_no_image_and_runs_one_copy(
        cluster: RunningCluster, harness: Harness, tmp_path: Path) -> None:
    kill_mid_stream(cluster, harness, tmp_path, lambda source, target: source, restart_agent)


def test_kill_9_of_the_target_agent_mid_stream_loses_no_image_and_runs_one_copy(
        cluster: RunningCluster, harness: Harness, tmp_path: Path) -> None:
    kill_mid_stream(cluster, harness, tmp_path, lambda source, target: target, restart_agent)


def test_kill_9_of_the_coordinator_mid_stream_loses_no_image_and_runs_one_copy(
        cluster: RunningCluster, harness: Harness, tmp_path: Path) -> None:
    kill_mid_stream(cluster, harness, tmp_path, lambda source, target: "checkpoint", restarted_by_rota_up)
