"""Job arrays and dependencies on a real local cluster (2 nodes x 2 GPUs), through the CLI:
an array of 6 tasks with %2 never runs more than 2 at once and each task sees its index
(Rota's and Slurm's names); `rota explain ARRAY` says why its tasks wait; another
tenant's token can neither cancel, pause, move nor read the array or its tasks;
`rota cancel ARRAY` stops every task; B after A starts once A
succeeded; a dependent of a failing job fails with the reason; bad input is refused naming
the field; an array of 10,000 tasks is accepted in one call (its time printed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import FINAL, REPO, RunningCluster, own_cluster

from rota.client import NotFoundError, job_spec_from_mapping

pytestmark = pytest.mark.e2e
HOLDING = ("SCHEDULED", "RUNNING")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "arrays", nodes=2, gpus_per_node=2)


def job_file(folder: Path, name: str, script: str, **fields: Any) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"name": name, "tenant": "demo", "kind": "training", "gpus": 1,
                                "command": ["sh", "-c", script], "duration": "30s", **fields}))
    return path


def tasks_of(cluster: RunningCluster, array_id: str) -> list[dict[str, Any]]:
    return [j for j in cluster.cli_json("jobs") if j["array"] == array_id]


def test_an_array_runs_at_most_k_at_once_and_each_task_sees_its_index(cluster: RunningCluster, tmp_path: Path) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    script = f'echo "$ROTA_ARRAY_ID $ROTA_ARRAY_INDEX $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID" > {out}/$ROTA_ARRAY_INDEX; sleep 1.5'
    submitted = cluster.cli_json("submit", str(job_file(tmp_path, "arr", script)), "--array", "0-5%2")
    array_id = submitted["array"]
    assert submitted["count"] == 6 and submitted["jobs"] == [f"{array_id}_{i}" for i in range(6)]
    most = 0
    deadline = time.monotonic() + 90
    while True:  # sample the listing while it runs: never more than 2 tasks hold GPUs
        states = [t["state"] for t in tasks_of(cluster, array_id)]
        most = max(most, sum(s in HOLDING for s in states))
        if len(states) == 6 and all(s in FINAL for s in states):
            break
        assert time.monotonic() < deadline, f"array stuck: {states}"
        time.sleep(0.2)
    assert most <= 2 and most >= 1
    assert {t["state"] for t in tasks_of(cluster, array_id)} == {"SUCCEEDED"}
    for i in range(6):
        assert (out / str(i)).read_text().split() == [array_id, str(i), array_id, str(i)]
    shown = cluster.cli_json("job", array_id)  # `rota job ARRAY`, as Slurm's `squeue -j ARRAY`
    assert (shown["count"], shown["states"], shown["jobs"]) == (6, {"SUCCEEDED": 6}, submitted["jobs"])
    assert f"{array_id}  array arr" in cluster.cli("job", array_id).stdout
    missing = cluster.cli("job", "j-nosucharray", check=False)
    assert missing.returncode == 1 and "NOT_FOUND: job j-nosucharray not found" in missing.stderr
    table = cluster.cli("jobs").stdout
    assert array_id in table and "succeeded=6" in table  # one row for the array
    assert f"{array_id}_3" not in table and f"{array_id}_3" in cluster.cli("jobs", "--expand").stdout


def test_cancel_of_an_array_stops_every_task(cluster: RunningCluster, tmp_path: Path) -> None:
    submitted = cluster.cli_json("submit", str(job_file(tmp_path, "long", "sleep 120")), "--array", "0-3%1")
    first = cluster.wait_job(submitted["jobs"][0], states=("RUNNING",), timeout_s=60)
    waiting = cluster.wait_job(submitted["jobs"][2], states=("PENDING",), reason="runs 1 of at most 1 at once")
    assert first.node and waiting.state == "PENDING"
    assert "runs 1 of at most 1 at once" in cluster.cli("explain", submitted["jobs"][2]).stdout
    # `rota explain ARRAY`: its tasks counted, and why the waiting ones wait (the %1 cap).
    explained = cluster.cli("explain", submitted["array"]).stdout
    assert f"array {submitted['array']}: 4 tasks, at most 1 at once: 1 running, 3 waiting" in explained, explained
    assert "3 wait for the array's %1 cap" in explained, explained
    # Another tenant's token: the array and its tasks read as missing, and nothing changes.
    other = cluster.cli_json("tenants", "add", "arrays-other")["token"]
    for command in (("cancel", submitted["array"]), ("explain", submitted["array"]), ("job", submitted["array"]),
                    ("cancel", first.id), ("explain", first.id)):
        refused = cluster.cli(*command, token=other, check=False)
        assert refused.returncode == 1 and "NOT_FOUND" in refused.stderr, (command, refused.stderr)
    with cluster.client(token=other) as theirs:
        for call in (lambda: theirs.pause(first.id), lambda: theirs.migrate(first.id),
                     lambda: theirs.checkpoint(first.id), lambda: theirs.resume(first.id),
                     lambda: theirs.cancel_array(submitted["array"])):
            with pytest.raises(NotFoundError):
                call()
    assert cluster.wait_job(first.id, states=("RUNNING",), timeout_s=5).state == "RUNNING"
    cancelled = cluster.cli_json("cancel", submitted["array"])
    assert cancelled["array"] == submitted["array"] and sorted(cancelled["jobs"]) == sorted(submitted["jobs"])
    for job_id in submitted["jobs"]:
        assert cluster.wait_job(job_id, timeout_s=30).state == "CANCELLED"


def test_a_dependent_starts_after_its_parent_succeeded(cluster: RunningCluster, tmp_path: Path) -> None:
    a = cluster.cli_json("submit", str(job_file(tmp_path, "a", "sleep 3")))["id"]
    b = cluster.cli_json("submit", str(job_file(tmp_path, "b", "true")), "--after", a)["id"]
    waiting = cluster.wait_job(b, states=("PENDING",), reason=f"waits for {a} to succeed", timeout_s=30)
    assert cluster.client().get_job(a).state in ("PENDING", *HOLDING) and waiting.started_at is None
    assert f"waits for {a} to succeed" in cluster.cli("explain", b).stdout
    done_a, done_b = cluster.wait_job(a, timeout_s=60), cluster.wait_job(b, timeout_s=60)
    assert (done_a.state, done_b.state) == ("SUCCEEDED", "SUCCEEDED")
    assert done_a.finished_at is not None and done_b.started_at is not None and done_b.started_at >= done_a.finished_at


def test_a_dependent_of_a_failing_job_fails_with_the_reason(cluster: RunningCluster, tmp_path: Path) -> None:
    f = cluster.cli_json("submit", str(job_file(tmp_path, "f", "sleep 1; exit 3")))["id"]
    c = cluster.cli_json("submit", str(job_file(tmp_path, "c", "true", depends_on=[{"job": f}])))["id"]
    d = cluster.cli_json("submit", str(job_file(tmp_path, "d", "true", depends_on=[{"job": f, "when": "failed"}])))["id"]
    assert cluster.wait_job(f, timeout_s=60).state == "FAILED"
    failed = cluster.wait_job(c, timeout_s=30)
    assert failed.state == "FAILED" and failed.reason == f"dependency {f} failed; it can no longer succeed"
    assert failed.started_at is None
    assert cluster.wait_job(d, timeout_s=60).state == "SUCCEEDED"  # afternotok: it ran


def test_bad_arrays_and_dependencies_are_refused_naming_the_field(cluster: RunningCluster, tmp_path: Path) -> None:
    path = str(job_file(tmp_path, "bad", "true"))
    for array, says in (("5-2", "reversed"), ("0-200000", "more than 100000 tasks"), ("1,1", "given twice"),
                        ("", "no indices")):
        refused = cluster.cli("submit", path, "--array", array or "%2", check=False)
        assert refused.returncode != 0 and "INVALID_ARGUMENT: array:" in refused.stderr and says in refused.stderr
    unknown = cluster.cli("submit", path, "--after", "j-0000000000", check=False)
    assert unknown.returncode != 0 and "INVALID_ARGUMENT: depends_on[0].job:" in unknown.stderr
    cluster.cli("tenants", "add", "other")
    theirs = cluster.cli_json("submit", str(job_file(tmp_path, "theirs", "true", tenant="other")))["id"]
    refused = cluster.cli("submit", path, "--after", theirs, check=False)
    assert refused.returncode != 0 and "depends_on[0].job:" in refused.stderr and "of tenant demo" in refused.stderr
    twice = cluster.cli("submit", str(job_file(tmp_path, "twice", "true", depends_on=[theirs, theirs])), check=False)
    assert twice.returncode != 0 and "depends_on[1].job:" in twice.stderr


def test_an_array_of_10000_is_one_call(cluster: RunningCluster) -> None:
    spec = job_spec_from_mapping({"name": "many", "tenant": "demo", "kind": "training", "gpus": 1,
                              "command": ["sleep", "600"], "priority": 1}, base_dir=REPO)
    with cluster.client() as client:
        started = time.perf_counter()
        array = client.submit_array(spec=spec, indices=range(10_000), max_running=1)
        took = time.perf_counter() - started
        print(f"\nan array of 10,000 tasks accepted in {took:.3f} s (one RPC)")  # printed, never asserted
        assert len(array.job_ids) == 10_000 and array.job_ids[-1] == f"{array.id}_9999"
        cancelled = client.cancel_array(array.id)
        assert cancelled.states.get("CANCELLED", 0) + cancelled.states.get("SUCCEEDED", 0) >= 9_999
