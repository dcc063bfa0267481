"""The agent's process table with real subprocesses: environment, exit records, fencing by
epoch, stopping whole process groups, adoption after a restart, and the launcher's lease fence.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import polling
import pytest

from rota.agent.launcher import FENCED_EXIT
from rota.agent.processes import ERROR_TAIL_LINES, LocalJob, ProcessTable
from rota.core.errors import FailedPrecondition

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    return polling.wait_until(predicate, timeout)


def wait_exit(job: LocalJob, timeout: float = 15.0) -> int:
    assert wait_until(lambda: job.exit_code() is not None, timeout), f"{job.job_id} still running"
    code = job.exit_code()
    assert code is not None
    return code


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a container's init may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Tables:
    """Process tables on one agent home; stops everything they started at the end."""

    def __init__(self, home: Path, lease_timeout_s: float) -> None:
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        self.lease = home / "lease"
        self.lease.touch()
        self.lease_timeout_s = lease_timeout_s
        self.made: list[ProcessTable] = []

    def new(self) -> ProcessTable:
        table = ProcessTable("node-a", self.home, self.lease, self.lease_timeout_s)
        self.made.append(table)
        return table

    def close(self) -> None:
        for table in self.made:
            table.stop_all("test over", grace_s=2)
            for job in table.jobs.values():
                if job.popen is not None:
                    job.popen.wait(timeout=10)


@pytest.fixture
def tables(tmp_path: Path) -> Iterator[Tables]:
    t = Tables(tmp_path / "agent", lease_timeout_s=60)
    yield t
    t.close()


@pytest.fixture
def table(tables: Tables) -> ProcessTable:
    return tables.new()


def launch(table: ProcessTable, job_id: str, epoch: int, gpus: list[int], command: list[str], *,
           workdir: str = "", env: dict[str, str] | None = None, virtual: bool = True) -> LocalJob:
    return table.launch(job_id, epoch, gpus, command, workdir, env or {}, virtual)


def test_launch_runs_the_command_with_rota_env(
    table: ProcessTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROTA_ADMIN_TOKEN", "control-plane-secret")
    workdir = tmp_path / "work"
    workdir.mkdir()
    dump = (
        "import json, os; "
        "keep = {k: v for k, v in os.environ.items() if k.startswith('ROTA_') or k in ('CUDA_VISIBLE_DEVICES', 'EXTRA')}; "
        "json.dump({'env': keep, 'cwd': os.getcwd()}, open('env.json', 'w'))"
    )
    job = launch(table, "j-env", 7, [0, 1], [PY, "-c", dump], workdir=str(workdir), env={"EXTRA": "1"})
    assert wait_exit(job) == 0
    assert job.state() == "SUCCEEDED"
    seen = json.loads((workdir / "env.json").read_text())
    assert seen["cwd"] == str(workdir)
    assert seen["env"] == {
        "ROTA_JOB_ID": "j-env",
        "ROTA_NODE": "node-a",
        "ROTA_EPOCH": "7",
        "ROTA_GPUS": "0,1",
        "ROTA_PROGRESS_FILE": str(job.folder / "progress.jsonl"),
        "ROTA_REPLICAS_FILE": str(job.folder / "replicas.json"),
        "ROTA_ITERATIONS_FILE": str(job.folder / "iterations.jsonl"),
        "ROTA_CONTROL_DIR": str(job.folder / "control"),
        "ROTA_BUBBLE_GUESTS_FILE": str(job.folder / "guests.json"),
        "CUDA_VISIBLE_DEVICES": "",  # virtual slots hide every real device
        "EXTRA": "1",
    }
    assert job.folder == table.home / "jobs" / "j-env-7"
    meta = json.loads((job.folder / "meta.json").read_text())
    assert meta == {"job_id": "j-env", "epoch": 7, "gpus": [0, 1], "pgid": job.pgid}


def test_real_gpus_are_pinned(table: ProcessTable, tmp_path: Path) -> None:
    out = tmp_path / "cvd"
    cmd = [PY, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"]
    job = launch(table, "j-gpu", 1, [2, 3], cmd, virtual=False)
    assert wait_exit(job) == 0
    assert out.read_text() == "2,3"


def test_missing_workdir_falls_back_to_the_agent_home(table: ProcessTable, tmp_path: Path) -> None:
    out = tmp_path / "cwd"
    cmd = [PY, "-c", f"import os; open({str(out)!r}, 'w').write(os.getcwd())"]
    assert wait_exit(launch(table, "j-cwd", 1, [0], cmd, workdir=str(tmp_path / "absent"))) == 0
    assert out.read_text() == str(table.home)


def test_exit_codes_and_progress_are_recorded(table: ProcessTable) -> None:
    ok = launch(table, "j-ok", 1, [0], [PY, "-c",
        "import json, os; f = open(os.environ['ROTA_PROGRESS_FILE'], 'a'); "
        "f.write(json.dumps({'step': 1}) + '\\n'); f.write(json.dumps({'step': 2, 'loss': 0.5}) + '\\n')"])
    bad = launch(table, "j-bad", 1, [1], [PY, "-c",
        "import sys\nfor i in range(30): print('line', i)\nprint('simulated failure: bad shard 3', file=sys.stderr)\nsys.exit(3)"])
    assert wait_exit(ok) == 0 and ok.state() == "SUCCEEDED"
    assert json.loads(ok.progress_json()) == {"step": 2, "loss": 0.5}
    assert (ok.folder / "exit").read_text().split()[0] == "0"

    assert wait_exit(bad) == 3 and bad.state() == "FAILED"
    error = bad.error().splitlines()
    assert len(error) == ERROR_TAIL_LINES
    assert error[-1] == "simulated failure: bad shard 3"
    assert "line 29" in error and "line 0" not in error
    assert {j.job_id for j in table.running()} == set()


def test_a_program_that_cannot_start_fails_with_a_reason(table: ProcessTable, tmp_path: Path) -> None:
    job = launch(table, "j-missing", 1, [0], [str(tmp_path / "no-such-program")])
    assert wait_exit(job) == 127
    assert job.state() == "FAILED"
    assert "cannot start" in job.error()


def test_stale_epoch_for_the_same_job_is_refused(table: ProcessTable) -> None:
    job = launch(table, "j-1", 5, [0], SLEEP)
    assert launch(table, "j-1", 5, [0], SLEEP) is job  # the same command again is a no-op
    with pytest.raises(FailedPrecondition, match="stale epoch 4"):
        launch(table, "j-1", 4, [0], SLEEP)
    with pytest.raises(FailedPrecondition, match="stale epoch 3"):
        table.stop("j-1", 3, "old allocator", grace_s=1)
    assert job.exit_code() is None and table.max_epoch == 5


def test_newer_epoch_of_the_same_job_replaces_the_old_copy(table: ProcessTable) -> None:
    old = launch(table, "j-1", 5, [0], SLEEP)
    new = launch(table, "j-1", 6, [1], SLEEP)
    assert old.exit_code() is not None and old.state() == "FAILED"
    assert "superseded" in old.error()
    assert new.exit_code() is None and table.jobs["j-1"] is new


def test_newer_epoch_on_overlapping_gpus_stops_the_older_job(table: ProcessTable) -> None:
    older = launch(table, "j-old", 10, [0, 1], SLEEP)
    bystander = launch(table, "j-other", 9, [2], SLEEP)
    newer = launch(table, "j-new", 11, [1], SLEEP)
    assert older.exit_code() is not None and older.state() == "FAILED"
    assert "GPUs reassigned at epoch 11" in older.error()
    assert not pid_alive(older.pgid)
    assert newer.exit_code() is None and bystander.exit_code() is None
    # And the other way round: an older command for GPUs held at a newer epoch is refused.
    with pytest.raises(FailedPrecondition, match="held by j-new"):
        launch(table, "j-late", 8, [1], SLEEP)
    assert newer.exit_code() is None


def test_stop_kills_the_whole_process_group(table: ProcessTable, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # The job starts a grandchild that ignores SIGTERM, then sleeps itself.
    script = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(120)\n"
    )
    job = launch(table, "j-tree", 1, [0], [PY, "-c", script])
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    assert pid_alive(grandchild) and os.getpgid(grandchild) == job.pgid
    assert table.stop("j-tree", 1, "cancelled", grace_s=5)
    assert job.state() == "FAILED" and job.error() == "stopped: cancelled"
    assert wait_until(lambda: not pid_alive(grandchild), timeout=5), "the grandchild survived the stop"
    assert not pid_alive(job.pgid)
    assert not table.stop("j-unknown", 1, "x", grace_s=1)


def test_a_restarted_agent_adopts_its_running_jobs(tables: Tables) -> None:
    first = tables.new()
    running = launch(first, "j-run", 3, [0], SLEEP)
    done = launch(first, "j-done", 4, [1], [PY, "-c", "raise SystemExit(2)"])
    acked = launch(first, "j-acked", 2, [2], [PY, "-c", "pass"])
    assert wait_exit(done) == 2 and wait_exit(acked) == 0
    first.acknowledge_finished([acked])
    assert "j-acked" not in first.jobs

    second = tables.new()  # the agent restarted on the same folder
    second.adopt()
    assert set(second.jobs) == {"j-run", "j-done"}
    adopted = second.jobs["j-run"]
    assert (adopted.epoch, adopted.gpus, adopted.pgid, adopted.popen) == (3, [0], running.pgid, None)
    assert adopted.exit_code() is None and [j.job_id for j in second.running()] == ["j-run"]
    assert second.jobs["j-done"].exit_code() == 2 and second.jobs["j-done"].state() == "FAILED"
    assert second.max_epoch == 4
    # Its fencing survives the restart too, and it can stop what it adopted.
    with pytest.raises(FailedPrecondition):
        launch(second, "j-run", 2, [0], SLEEP)
    with pytest.raises(FailedPrecondition, match="already ran under epoch 2"):
        launch(second, "j-acked", 2, [2], SLEEP)
    assert second.stop("j-run", 3, "cancelled", grace_s=5)
    assert adopted.exit_code() is not None and adopted.state() == "FAILED"
    assert second.find_log("j-run") == adopted.log_path
    assert second.find_log("j-acked") == tables.home / "jobs" / "j-acked-2" / "log"
    assert second.find_log("j-never") is None


def test_launcher_fences_the_job_when_the_lease_goes_stale(tmp_path: Path) -> None:
    tables = Tables(tmp_path / "agent", lease_timeout_s=1.0)
    table = tables.new()
    try:
        pid_file = tmp_path / "job.pid"
        job = launch(table, "j-fenced", 1, [0], [PY, "-c",
            f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"])
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", timeout=5)
        # The agent stops renewing its lease (it died): the launcher kills the job itself.
        started = time.monotonic()
        assert wait_exit(job, timeout=10) == FENCED_EXIT
        assert time.monotonic() - started < 8
        assert "fenced: agent lease expired" in (job.folder / "exit").read_text()
        assert "agent lease expired" in job.error()
        assert job.state() == "FAILED"
        assert wait_until(lambda: not pid_alive(int(pid_file.read_text())), timeout=5)
    finally:
        tables.close()


def test_a_renewed_lease_keeps_the_job_running(tmp_path: Path) -> None:
    tables = Tables(tmp_path / "agent", lease_timeout_s=1.0)
    table = tables.new()
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.2):
            tables.lease.touch()

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        job = launch(table, "j-kept", 1, [0], [PY, "-c", "import time; time.sleep(2.0)"])
        assert wait_exit(job, timeout=10) == 0
        assert job.state() == "SUCCEEDED"
    finally:
        stop.set()
        renewer.join()
        tables.close()


def test_a_job_killed_by_a_signal_reports_128_plus_the_signal(table: ProcessTable) -> None:
    job = launch(table, "j-killed", 1, [0], [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert wait_exit(job) == 128 + 9
    assert job.state() == "FAILED"
    assert (job.folder / "exit").read_text().split("\n")[:2] == ["137", "signal 9"]


def test_resize_moves_a_running_app_to_new_gpus_under_a_newer_epoch_and_refuses_an_older_one(table: ProcessTable) -> None:
    job = launch(table, "j-app", 5, [0], [PY, "-c", "import time; time.sleep(30)"])
    try:
        resized = table.resize("j-app", 6, [0, 1])
        assert (resized.epoch, resized.gpus) == (6, [0, 1])
        assert json.loads((job.folder / "replicas.json").read_text()) == {"epoch": 6, "gpus": [0, 1], "replicas": 2}
        assert json.loads((job.folder / "meta.json").read_text())["epoch"] == 6
        assert table.resize("j-app", 6, [0, 1]) is resized  # a repeat changes nothing
        with pytest.raises(FailedPrecondition, match="stale epoch"):
            table.resize("j-app", 5, [0])
        table.adopt()  # a restarted agent adopts the app at its resized epoch
        assert table.jobs["j-app"].epoch == 6
    finally:
        table.stop("j-app", 0, "test over", grace_s=2)


def test_a_relaid_out_job_gets_its_layout_and_others_get_none(table: ProcessTable, tmp_path: Path) -> None:
    dump = "import json, os; json.dump(os.environ.get('ROTA_LAYOUT'), open('layout.json', 'w'))"
    layout = json.dumps({"tp": 2, "pp": 2, "dp": 1, "layers_per_stage": [10, 6]})
    for job_id, given in (("j-relaid", layout), ("j-plain", "")):
        workdir = tmp_path / job_id
        workdir.mkdir()
        job = table.launch(job_id, 3, [0], [PY, "-c", dump], str(workdir), {}, True, None, given)
        assert wait_exit(job) == 0
        assert json.loads((workdir / "layout.json").read_text()) == (given or None)


def test_a_restarted_agent_whose_lease_lapsed_stops_what_it_finds_instead_of_adopting_it(tables: Tables) -> None:
    first = tables.new()
    running = launch(first, "j-late", 5, [0], SLEEP)
    second = tables.new()
    # The agent was down longer than the lease: the control plane has given the job up.
    old = time.time() - 10 * tables.lease_timeout_s
    os.utime(tables.lease, (old, old))
    assert second.lease_expired()
    second.adopt(fence=True)
    assert running.popen is not None
    running.popen.wait(timeout=5)  # reaped (a real restarted agent is not the launcher's parent)
    job = second.jobs["j-late"]
    assert job.state() == "FAILED" and "lease lapsed" in job.error()
    tables.lease.touch()
    assert not second.lease_expired()
