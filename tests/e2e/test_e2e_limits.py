"""Limits enforced on the node (issue 35 item 1) on a real local cluster: PyTorch jobs in
their own cgroups. A job that allocates past its `memory` ends FAILED with `out of memory
(limit ...)` in `rota job ID` while its neighbour on the node runs on and succeeds; a job
past its `time_limit` is stopped and says so; bad limits are refused naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import RunningCluster, own_cluster, wait_until

from rota.agent import cgroups
from rota.client import InvalidArgumentError, job_spec_from_mapping

# Tensors of 64 MiB, each filled (resident), until 4 GiB: far past a 768 MiB limit.
HOG = ("import time, torch\nheld = []\nfor i in range(64):\n    held.append(torch.ones(16 << 20))\n"
       "    print('held', (i + 1) * 64, 'MiB', flush=True)\n    time.sleep(0.05)\nprint('never here', flush=True)\n")
# A small model trained for ~15 s, reporting its steps; fits well inside its 1 GiB.
NEIGHBOUR = ("import time, torch\nfrom rota import runtime\nmodel = torch.nn.Linear(64, 64)\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.01)\nend = time.monotonic() + 15\nstep = 0\n"
             "while time.monotonic() < end:\n    loss = model(torch.randn(32, 64)).pow(2).mean()\n"
             "    opt.zero_grad(); loss.backward(); opt.step(); step += 1\n"
             "    if step % 50 == 0: runtime.report(step=step, loss=float(loss))\n    time.sleep(0.01)\n"
             "runtime.report(step=step, loss=float(loss))\n")
SLOW = "import time, torch\nx = torch.zeros(4)\nwhile True:\n    x += 1\n    time.sleep(0.2)\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    if isinstance(cgroups.detect("e2e-probe"), str):
        pytest.skip(f"the agent cannot make cgroups here: {cgroups.detect('e2e-probe')}")
    _remove_probe()
    yield from own_cluster(tmp_path_factory, databases, redis_url, "limits", nodes=1, gpus_per_node=2)


def _remove_probe() -> None:
    found = cgroups.detect("e2e-probe")
    if not isinstance(found, str):
        for parent in set(found.parents.values()):
            parent.rmdir()


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def test_a_job_past_its_memory_fails_out_of_memory_while_its_neighbour_runs_on(cluster: RunningCluster) -> None:
    neighbour = cluster.submit_job("calm", python(NEIGHBOUR), memory="1Gi", cpus=1)
    cluster.wait_job(neighbour, ("RUNNING",))
    hog = cluster.submit_job("hog", python(HOG), memory="768Mi", cpus=1)
    failed = cluster.wait_job(hog, timeout_s=180)
    assert failed.state == "FAILED", (failed.state, failed.reason, failed.error)
    assert failed.reason == "out of memory (limit 768 MiB)", failed.reason
    assert failed.node == cluster.wait_job(neighbour, ("RUNNING", "SUCCEEDED")).node  # the same node
    shown = cluster.cli("job", hog).stdout
    assert "out of memory (limit 768 MiB)" in shown, shown
    assert cluster.wait_job(neighbour, ("RUNNING",)).state == "RUNNING"  # still running after the kill
    done = cluster.wait_job(neighbour, timeout_s=180)
    assert done.state == "SUCCEEDED", (done.reason, done.error)
    assert done.progress["step"] >= 50
    shown_json = cluster.cli_json("job", hog)
    assert (shown_json["memory"], shown_json["cpus"], shown_json["time_limit"]) == ("768Mi", 1.0, None)
    assert "limits:   cpus 1, memory 768Mi" in shown


def test_a_job_past_its_time_limit_is_stopped_with_the_reason(cluster: RunningCluster) -> None:
    job_id = cluster.submit_job("slow", python(SLOW), time_limit="6s")
    job = cluster.wait_job(job_id, timeout_s=120)
    assert job.state == "FAILED" and job.reason == "time limit 0:00:06 reached", (job.state, job.reason)
    assert "time limit 0:00:06 reached" in cluster.cli("job", job_id).stdout
    assert job.started_at is not None and job.finished_at is not None
    assert (job.finished_at - job.started_at).total_seconds() >= 6


def _job_cgroups(job_id: str) -> list[Path]:
    """The folders of the job's cgroups, in every hierarchy (rota/<agent>/<job>-<epoch>)."""
    v2, v1 = cgroups.mounts(Path("/proc/self/mountinfo").read_text())
    roots = {*v1.values(), *([v2] if v2 else [])}
    return sorted(f for root in roots for f in root.glob(f"rota/*/{job_id}-*") if f.is_dir())


def test_a_jobs_cgroup_exists_while_it_runs_and_is_removed_once_reported(cluster: RunningCluster) -> None:
    job_id = cluster.submit_job("quick", python("import time, torch; print(torch.ones(2).sum()); time.sleep(4)"),
                                memory="512Mi", cpus=0.5)
    cluster.wait_job(job_id, ("RUNNING",))
    folders = _job_cgroups(job_id)
    assert {f.parent.parent.parent.name for f in folders} >= {"memory", "cpu", "pids"}, folders
    assert all(f.parent.name.startswith("node-1.") for f in folders)  # the agent's own parent
    assert cluster.wait_job(job_id).state == "SUCCEEDED"
    # Removed once the agent's report of the end is answered (the same beat, or the next).
    wait_until(lambda: _job_cgroups(job_id) == [], 10, f"{job_id}'s cgroups removed")


@pytest.mark.parametrize(("fields", "field"), [
    ({"memory": "-4Gi"}, "memory"), ({"memory": "4GB"}, "memory"), ({"cpus": 0}, "cpus"), ({"time_limit": 0}, "time_limit"),
])
def test_bad_limits_are_refused_naming_the_field(cluster: RunningCluster, fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        spec = job_spec_from_mapping({"tenant": "demo", "command": ["true"], **fields}, base_dir=Path.cwd())
        with cluster.client() as client:
            client.submit(spec=spec)
    assert caught.value.field == field, caught.value


@pytest.fixture(scope="module")
def without_cgroups(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    """A cluster whose agent makes no cgroups (as one without permission would)."""
    yield from own_cluster(tmp_path_factory, databases, redis_url, "nocgroups", nodes=1, gpus_per_node=2,
                           extra_env={"ROTA_AGENT_CGROUPS": "off"})


def test_without_cgroups_a_job_with_limits_is_refused_and_says_why(without_cgroups: RunningCluster) -> None:
    limited = without_cgroups.submit_job("limited", python("import torch"), memory="1Gi")
    plain = without_cgroups.submit_job("plain", python("import torch; print(torch.ones(3).sum())"), time_limit="5m")
    refused = without_cgroups.wait_job(limited)
    assert refused.state == "FAILED", (refused.state, refused.reason)
    assert refused.reason.startswith("refused: this node cannot enforce cpus or memory limits"), refused.reason
    assert "ROTA_AGENT_CGROUPS=off" in refused.reason
    assert without_cgroups.wait_job(plain).state == "SUCCEEDED"  # no cpus or memory: it runs
    logs = "".join(f.read_text(errors="replace") for f in (without_cgroups.home / "logs").glob("*.log"))
    assert "cgroups unavailable: turned off" in logs  # the agent said so at start
