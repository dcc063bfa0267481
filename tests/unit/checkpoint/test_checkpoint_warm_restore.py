"""A warm restore target on the same host: it is started before the image exists, takes the
staged copy by hard links while the durable write goes on, and falls back to the store once
the write is done; and a job with no tensors checkpoints without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rota import imageformat
from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.processes import LocalJob, ProcessTable
from rota.imagestore.settings import CheckpointSettings
from rota.jobfiles import control
from rota.runtime import Checkpointer

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AgentCheckpoints, LocalJob]]:
    home = tmp_path / "agent"
    home.mkdir()
    table = ProcessTable("n1", home, home / "lease", 60)
    settings = CheckpointSettings(store_dir=tmp_path / "chunks", fsync=False, staging_root=tmp_path / "staging" / "n1")
    checkpoints = AgentCheckpoints("n1", table, home, settings)
    folder = home / "jobs" / "j-1-3"
    (folder / "control").mkdir(parents=True)
    job = LocalJob("j-1", 3, [0], os.getpgid(0), folder)  # runs as long as this test: our own process group
    table.jobs["j-1"] = job
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(folder / "control"))
    try:
        yield checkpoints, job
    finally:
        checkpoints.close()


def train_in_a_thread(ckpt: Checkpointer, stop: threading.Event) -> threading.Thread:
    """The job's loop: a safe point every millisecond, until told to stop."""
    def loop() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            ckpt.safe_point(step)
            time.sleep(0.001)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    return worker


def test_a_warm_target_takes_the_staged_copy_while_the_write_goes_on_then_the_store(
    agent: tuple[AgentCheckpoints, LocalJob], tmp_path: Path
) -> None:
    checkpoints, job = agent
    model = torch.nn.Linear(64, 64)
    ckpt = Checkpointer(model=model)
    stop = threading.Event()
    worker = train_in_a_thread(ckpt, stop)
    hold = threading.Event()
    checkpoints.writer.submit(hold.wait, 30)  # the durable write queues behind this: still going on
    warm = tmp_path / "warm"
    checkpoints.start_restore(warm, "img-1", wait_s=30)  # before the image exists: a warm target
    time.sleep(0.05)
    assert not (warm / control.READY).exists()
    try:
        record = checkpoints._quiesce(job, "img-1", False, 5.0, False)
        assert record is not None and record.state == "writing"
        deadline = time.monotonic() + 10
        while not (warm / control.READY).exists():
            assert time.monotonic() < deadline, "the warm target never got the staged copy"
            time.sleep(0.005)
        assert record.state == "writing"
        with pytest.raises(FileNotFoundError):
            checkpoints.store.get_manifest("img-1")  # not durable yet: the target did not wait for it
        blob = imageformat.blob_path(warm, 0)
        assert blob.stat().st_nlink == 2  # the staged file itself, linked: no byte copied
        index, state = imageformat.load(warm, 0)
        assert "sources" not in index and torch.equal(state["object:model"]["weight"], model.weight.detach())
    finally:
        hold.set()
        stop.set()
        worker.join(5)
    deadline = time.monotonic() + 10
    while checkpoints.status("img-1").state == "writing":  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert checkpoints.status("img-1").state == "complete"  # type: ignore[union-attr]
    assert not checkpoints.handoff_path("img-1").exists()  # the offer ends with the write
    assert imageformat.load(warm, 0)[1]["object:model"]["weight"].equal(model.weight.detach())  # links outlive the staging
    cold = tmp_path / "cold"
    checkpoints._materialize(cold, "img-1")  # from now on: the store
    index, state = imageformat.load(cold, 0)
    assert "sources" in index and torch.equal(state["object:model"]["weight"], model.weight.detach())


def test_a_restore_of_an_image_nobody_offers_fails_after_its_wait(
    agent: tuple[AgentCheckpoints, LocalJob], tmp_path: Path
) -> None:
    checkpoints, _ = agent
    checkpoints._materialize(tmp_path / "r", "img-none", wait_s=0.05)
    assert "img-none" in (tmp_path / "r" / control.FAILED).read_text()


def test_a_job_with_no_tensors_checkpoints_and_restores_without_importing_torch(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from rota import imageformat\nfrom rota.jobfiles import control\nfrom rota.runtime import Checkpointer\n"
        "ckpt = Checkpointer()\n"
        "ckpt.extra['seen'] = [1, 'two']\n"
        f"control.write_request(Path({str(tmp_path / 'control')!r}), control.Request(1, control.CHECKPOINT, "
        f"time.time() + 5, {str(tmp_path / 'st')!r}))\n"
        "ckpt.safe_point(12)\n"
        f"index, state = imageformat.load(Path({str(tmp_path / 'st')!r}), 0)\n"
        "assert state['step'] == 12 and state['extra'] == {'seen': [1, 'two']}, state\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'imported torch or numpy'\n"
        "print('ok')\n"
    )
    env = {**os.environ, control.ENV_CONTROL_DIR: str(tmp_path / "control")}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
