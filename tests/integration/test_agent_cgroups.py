"""Jobs in their own cgroups, with real processes and the machine's real cgroups (root
needed; skipped where the agent could not make them): a job over its memory is killed by
the kernel and says `out of memory (limit ...)` while its neighbour runs on; CPU quota and
pids.max are written; every cgroup made is removed; a job past its time limit is found; a
node without cgroups refuses a job with limits and says why."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import polling
import pytest

from rota.agent import cgroups
from rota.agent.launcher import CGROUP_EXIT
from rota.agent.processes import LocalJob, ProcessTable
from rota.core.node_reports import failure_reason

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]
# Touches 512 MiB page by page (a bytearray of zeros may not be resident): past a 64 MiB limit.
HOG = [PY, "-c", "import time\nb = bytearray(512 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(30)"]


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    return polling.wait_until(predicate, timeout)


@pytest.fixture
def node_cgroups() -> Iterator[cgroups.NodeCgroups]:
    node = f"test-{uuid.uuid4().hex[:8]}"
    found = cgroups.detect(node)
    if isinstance(found, str):
        pytest.skip(f"no cgroups here: {found}")
    yield found
    for parent in set(found.parents.values()):
        for child in parent.iterdir():
            if child.is_dir():
                cgroups.JobCgroup(found.hierarchy.version, {"x": child}).remove()
        parent.rmdir()


@pytest.fixture
def table(tmp_path: Path, node_cgroups: cgroups.NodeCgroups) -> Iterator[ProcessTable]:
    (tmp_path / "lease").touch()
    made = ProcessTable("n1", tmp_path, tmp_path / "lease", 30.0, cgroups=node_cgroups)
    yield made
    made.stop_all("test over", 1.0)
    made.acknowledge_finished(list(made.jobs.values()))


def launch(table: ProcessTable, job_id: str, command: list[str], limits: cgroups.Limits | None = None,
           time_limit_s: float | None = None) -> LocalJob:
    """On a GPU of its own (a launch on a held GPU would stop its holder)."""
    gpu = len(table.jobs)
    return table.launch(job_id, 1, [gpu], command, "", {}, True, limits=limits, time_limit_s=time_limit_s)


def test_a_job_over_its_memory_fails_with_the_reason_while_its_neighbour_runs_on(table: ProcessTable) -> None:
    neighbour = launch(table, "j-calm", SLEEP, cgroups.Limits(memory_bytes=256 << 20))
    hog = launch(table, "j-hog", HOG, cgroups.Limits(memory_bytes=64 << 20))
    assert wait_until(lambda: hog.exit_code() is not None), "the hog was never killed"
    assert hog.exit_code() == 137 and hog.state() == "FAILED"
    assert hog.error().splitlines()[0] == "out of memory (limit 64 MiB)"
    assert failure_reason(137, hog.error()) == "out of memory (limit 64 MiB)"
    assert neighbour.exit_code() is None and neighbour.error() == ""
    folders = list(hog.cgroup.dirs.values()) if hog.cgroup else []
    assert folders and all(f.exists() for f in folders)
    table.acknowledge_finished([hog])
    assert not any(f.exists() for f in folders)  # reported, then removed


def test_limits_are_written_and_the_job_is_inside(table: ProcessTable, node_cgroups: cgroups.NodeCgroups) -> None:
    job = launch(table, "j-in", SLEEP, cgroups.Limits(memory_bytes=1 << 30, cpus=0.5, pids_max=64))
    assert job.cgroup is not None
    version, dirs = job.cgroup.version, job.cgroup.dirs
    assert wait_until(lambda: bool((dirs["memory"] / "cgroup.procs").read_text().split()))
    members = {int(p) for p in (dirs["pids"] / "cgroup.procs").read_text().split()}
    assert job.pgid in members  # the launcher joined before it started the job
    if version == 1:
        assert int((dirs["memory"] / "memory.limit_in_bytes").read_text()) == 1 << 30
        assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
    else:
        assert int((dirs["memory"] / "memory.max").read_text()) == 1 << 30
        assert (dirs["cpu"] / "cpu.max").read_text().split() == ["50000", "100000"]
    assert (dirs["pids"] / "pids.max").read_text().strip() == "64"
    assert node_cgroups.hierarchy.version == version


def test_a_job_without_cpus_stays_out_of_the_cpu_controller(table: ProcessTable) -> None:
    """A cpu cgroup is one scheduling entity: a job without a quota keeps its usual share."""
    job = launch(table, "j-nocpu", SLEEP, cgroups.Limits(memory_bytes=1 << 30))
    assert job.cgroup is not None and set(job.cgroup.dirs) == {"memory", "pids"}


def test_a_fork_bomb_stays_within_pids_max(table: ProcessTable) -> None:
    forks = [PY, "-c", "import os, sys\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            import time; time.sleep(20); os._exit(0)\n"
             "        n += 1\nexcept OSError:\n    print('forks refused after', n, flush=True); sys.exit(3)\n"]
    job = launch(table, "j-forks", forks, cgroups.Limits(pids_max=20))
    assert wait_until(lambda: job.exit_code() is not None)
    assert job.exit_code() == 3 and "forks refused after" in job.error()


def test_a_job_past_its_time_limit_is_found_and_stopped_with_the_reason(table: ProcessTable) -> None:
    job = launch(table, "j-slow", SLEEP, time_limit_s=1.0)
    other = launch(table, "j-other", SLEEP, time_limit_s=3600.0)
    assert table.past_time_limits(time.time()) == []
    assert wait_until(lambda: bool(table.past_time_limits(time.time())), 5.0)
    [(late, reason)] = table.past_time_limits(time.time())
    assert late is job and reason == "time limit 0:00:01 reached"
    table.stop(job.job_id, job.epoch, reason, 2.0, verdict=True)
    assert job.state() == "FAILED" and failure_reason(job.exit_code() or 0, job.error()) == "time limit 0:00:01 reached"
    assert other.exit_code() is None


def test_without_cgroups_a_job_with_limits_is_refused_and_one_without_runs(tmp_path: Path) -> None:
    (tmp_path / "lease").touch()
    table = ProcessTable("n1", tmp_path, tmp_path / "lease", 30.0, cgroups=cgroups.detect("n1", "off"))
    try:
        refused = launch(table, "j-limited", SLEEP, cgroups.Limits(memory_bytes=1 << 30))
        plain = launch(table, "j-plain", SLEEP)
        assert refused.exit_code() == CGROUP_EXIT and refused.state() == "FAILED"
        reason = failure_reason(CGROUP_EXIT, refused.error())
        assert reason.startswith("refused: this node cannot enforce cpus or memory limits")
        assert "ROTA_AGENT_CGROUPS=off" in reason
        assert plain.exit_code() is None and plain.cgroup is None
    finally:
        table.stop_all("test over", 1.0)


def test_a_restarted_agent_adopts_the_cgroup_and_still_reads_the_oom(
    tmp_path: Path, table: ProcessTable, node_cgroups: cgroups.NodeCgroups,
) -> None:
    hog = launch(table, "j-hog2", HOG, cgroups.Limits(memory_bytes=64 << 20))
    assert wait_until(lambda: hog.exit_code() is not None)
    again = ProcessTable("n1", table.home, table.lease_file, 30.0, cgroups=node_cgroups)
    again.adopt()
    adopted = again.jobs["j-hog2"]
    assert adopted.cgroup == hog.cgroup
    assert adopted.error().startswith("out of memory (limit 64 MiB)")
    assert node_cgroups.sweep({"j-hog2-1"}) == 0  # an adopted job's cgroup stays until reported
    assert os.path.isdir(next(iter(hog.cgroup.dirs.values())) if hog.cgroup else "/nonexistent")


def test_the_cluster_stopping_removes_every_cgroup_and_the_nodes_own(tmp_path: Path) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    found = cgroups.detect(node)
    if isinstance(found, str):
        pytest.skip(f"no cgroups here: {found}")
    (tmp_path / "lease").touch()
    table = ProcessTable(node, tmp_path, tmp_path / "lease", 30.0, cgroups=found)
    job = launch(table, "j-a", SLEEP, cgroups.Limits(memory_bytes=256 << 20))
    assert job.cgroup is not None and all(d.exists() for d in job.cgroup.dirs.values())
    table.stop_all("cluster stopping", 1.0)
    table.remove_cgroups()
    assert not any(d.exists() for d in job.cgroup.dirs.values())
    assert not any(p.exists() for p in found.parents.values())
