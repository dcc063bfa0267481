"""The example jobs run for real, as the agent runs them: a subprocess from the repo root."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def job_env(progress: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONUNBUFFERED"] = "1"
    if progress is not None:
        env["ROTA_PROGRESS_FILE"] = str(progress)
    return env


def run(args: list[str], progress: Path | None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=job_env(progress),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_progress(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class ProgressPipe:
    """The job's progress file as a named pipe that this test reads: each report the job
    writes is an event the test waits on (no polling of the file).

    The pipe is held open for reading and writing (Linux), so the job's open-append-close
    per report never blocks and the reader never sees an end of file; `close` ends it.
    """

    END = "{}\n"  # what no job reports: tells the reader to stop

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.reports: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        self._pipe = open(os.open(path, os.O_RDWR), encoding="utf-8")  # closed by close()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while (line := self._pipe.readline()) != self.END:
            with self._arrived:
                self.reports.append(json.loads(line))
                self._arrived.notify_all()

    def wait_for(self, what: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float) -> None:
        with self._arrived:
            if not self._arrived.wait_for(lambda: predicate(self.reports), timeout):
                pytest.fail(f"{what}: reports so far {self.reports}")

    def close(self) -> None:
        with open(self.path, "w", encoding="utf-8") as end:
            end.write(self.END)
        self._reader.join(10)
        self._pipe.close()


def test_train_lm_reports_falling_loss(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    proc = run(["examples/train_lm.py", "--steps", "20", "--report-every", "5"], progress)
    assert proc.returncode == 0, proc.stderr
    reports = read_progress(progress)
    assert [r["step"] for r in reports] == [5, 10, 15, 20]
    assert set(reports[-1]) == {"step", "loss"}
    first, last = reports[0]["loss"], reports[-1]["loss"]
    assert math.isfinite(last)
    assert last < first
    assert "step 20/20 loss" in proc.stdout


def test_train_lm_final_report_is_the_last_step_even_off_the_interval(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    proc = run(["examples/train_lm.py", "--steps", "12", "--report-every", "5"], progress)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_progress(progress)] == [5, 10, 12]


def test_train_lm_is_reproducible(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        proc = run(["examples/train_lm.py", "--steps", "6", "--report-every", "3", "--seed", "3"], path)
        assert proc.returncode == 0, proc.stderr
    assert read_progress(a) == read_progress(b)


def test_train_ddp_runs_two_gloo_ranks(tmp_path: Path) -> None:
    progress, losses = tmp_path / "progress.jsonl", tmp_path / "losses.txt"
    proc = run(["examples/train_ddp.py", "--steps", "4", "--ranks", "2", "--report-every", "2",
                "--losses", str(losses)], progress)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_progress(progress)] == [2, 4]  # rank 0 reports, once per step
    assert [int(line.split()[0]) for line in losses.read_text().splitlines()] == [1, 2, 3, 4]


def test_fail_job_exits_non_zero_with_its_message(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    proc = run(["examples/fail_job.py", "--delay", "0"], progress)
    assert proc.returncode != 0
    assert "RuntimeError: simulated failure: bad shard 3" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "RuntimeError: simulated failure: bad shard 3"
    assert read_progress(progress)[-1] == {"step": 3}


def test_sleep_job_stops_promptly_on_sigterm(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    pipe = ProgressPipe(progress)
    proc = subprocess.Popen(
        [sys.executable, "examples/sleep_job.py", "--seconds", "60", "--interval", "0.1"],
        cwd=ROOT,
        env=job_env(progress),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pipe.wait_for("sleep_job reported no progress", lambda reports: len(reports) >= 3, timeout=30)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert time.monotonic() - sent < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pipe.close()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM" in out


def test_sleep_job_finishes(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    proc = run(["examples/sleep_job.py", "--seconds", "0.3", "--interval", "0.1"], progress)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_progress(progress)] == [0, 1, 2, 3]


def test_quantize_lite_and_batch_infer_run(tmp_path: Path) -> None:
    q = tmp_path / "q.jsonl"
    proc = run(["examples/quantize_lite.py", "--train-steps", "20"], q)
    assert proc.returncode == 0, proc.stderr
    final = read_progress(q)[-1]
    assert final["step"] == final["layers"] == 3
    assert 0.0 < final["size_ratio"] < 0.3
    assert abs(final["accuracy_fp32"] - final["accuracy_int8"]) <= 0.05

    b = tmp_path / "b.jsonl"
    proc = run(["examples/batch_infer.py", "--batches", "5", "--batch-size", "8"], b)
    assert proc.returncode == 0, proc.stderr
    final = read_progress(b)[-1]
    assert final["step"] == 5 and final["items"] == 40


JOB_FILES = sorted(EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_job_files_follow_the_spec(path: Path) -> None:
    job = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(job, dict)
    allowed = {
        "name",
        "tenant",
        "kind",
        "priority",
        "gpus",
        "command",
        "workdir",
        "env",
        "duration",
        "preemptible",
        "restart",
        "features",
        "demand",
        "max_swap",
        "nodes",
        "gpus_per_node",
        "gpu_memory_mb",
        "accepts_layout_changes",
    }
    assert "tenant" not in job, "an example takes the caller's tenant (its token's), so any tenant can submit it"
    assert set(job) <= allowed, set(job) - allowed
    assert job["kind"] in {"training", "batch_inference", "quantization", "realtime", "trial"}
    assert 1 <= job["priority"] <= 10
    if job["kind"] == "realtime" and "gpus" not in job:
        assert job["demand"] and all(d >= 0 for d in job["demand"])
    elif "nodes" in job:  # a gang: whole nodes x GPUs on each, both powers of two
        assert all(job[k] >= 1 and job[k] & (job[k] - 1) == 0 for k in ("nodes", "gpus_per_node"))
    else:
        assert job["gpus"] >= 1 and job["gpus"] & (job["gpus"] - 1) == 0
    assert job.get("restart", "never") in {"never", "on-failure"}
    command = job["command"]
    assert isinstance(command, list) and all(isinstance(c, str) for c in command)
    assert command[0] == "python"
    assert (ROOT / command[1]).is_file(), f"{command[1]} is not a file relative to the repo root"


def test_the_required_job_files_exist() -> None:
    names = {p.name for p in JOB_FILES}
    assert {
        "train-small.yaml",
        "train-2gpu.yaml",
        "fail.yaml",
        "sleep.yaml",
        "quantize-lite.yaml",
        "batch-infer.yaml",
    } <= names
    small = yaml.safe_load((EXAMPLES / "train-small.yaml").read_text(encoding="utf-8"))
    assert small["command"] == ["python", "examples/train_lm.py", "--steps", "300", "--seed", "7"]
    assert (small["kind"], small["priority"], small["gpus"], small["restart"]) == (
        "training",
        5,
        1,
        "never",
    )


def test_serve_lm_follows_the_replica_file_as_the_agent_rewrites_it(tmp_path: Path) -> None:
    from rota.agent.processes import write_replicas

    progress = tmp_path / "progress.jsonl"
    pipe = ProgressPipe(progress)
    write_replicas(tmp_path, 5, [0])
    env = {**job_env(progress), "ROTA_REPLICAS_FILE": str(tmp_path / "replicas.json")}
    proc = subprocess.Popen(
        [sys.executable, "examples/serve_lm.py", "--seconds", "30"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        pipe.wait_for("serve_lm reported nothing", bool, timeout=60)
        write_replicas(tmp_path, 6, [0, 1, 2])
        pipe.wait_for("serve_lm never served on 3 replicas", lambda reports: reports[-1]["replicas"] == 3, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        pipe.close()
    reports = pipe.reports
    assert reports[0]["replicas"] == 1 and reports[0]["epoch"] == 5
    assert reports[-1]["replicas"] == 3 and reports[-1]["epoch"] == 6
    assert proc.returncode == 0, out
    assert "served" in out


def test_the_trial_example_trains_fused_trials_and_reports_their_losses(tmp_path: Path) -> None:
    out = tmp_path / "trial.jsonl"
    proc = run(["examples/trial_fused.py", "--steps", "20", "--fusion", "2"], out)
    assert proc.returncode == 0, proc.stderr
    final = read_progress(out)[-1]
    assert final["step"] == 20 and len(final["losses"]) == 2 and final["guest_of"] == ""
    bad = run(["examples/trial_fused.py", "--steps", "0"], tmp_path / "bad.jsonl")
    assert bad.returncode == 2 and "--steps: must be positive" in bad.stderr
