"""rota.runtime checkpointing: restored state and RNG streams, and the safe-point protocol
with its bounded waits: on the job's side and on the agent's."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rota import imageformat
from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.processes import LocalJob, ProcessTable
from rota.core.errors import FailedPrecondition
from rota.imagestore.settings import CheckpointSettings
from rota.jobfiles import control
from rota.runtime import Checkpointer, Paused, state


@pytest.fixture
def control_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "control"
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(folder))
    return folder


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Generator]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt, gen


def draws(model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> list[float]:
    """What the next iterations would compute: every RNG stream and the model's losses."""
    out = [random.random(), float(np.random.rand()), float(torch.rand(1))]
    for _ in range(2):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_a_restored_job_continues_with_the_same_state_and_rng_streams(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, gen = trained(1)
    random.seed(5)
    np.random.seed(5)
    ckpt = Checkpointer(model=model, optimizer=opt, data=gen)
    ckpt.step, ckpt.cursor, ckpt.extra = 3, {"shard": 2}, {"best": 0.5}
    imageformat.stage(tmp_path, 0, 1, 3, ckpt.snapshot())
    (tmp_path / control.READY).touch()
    want = draws(model, opt, gen)

    random.seed(99)
    np.random.seed(99)
    fresh_model, fresh_opt, fresh_gen = trained(2)  # different weights, RNG and optimizer state
    monkeypatch.setenv(control.ENV_RESTORE_DIR, str(tmp_path))
    restored = Checkpointer(model=fresh_model, optimizer=fresh_opt, data=fresh_gen)
    assert restored.restore() == 3
    assert restored.cursor == {"shard": 2} and restored.extra == {"best": 0.5}
    assert draws(fresh_model, fresh_opt, fresh_gen) == want  # bit-identical
    assert not imageformat.blob_path(tmp_path, 0).exists()  # the tmpfs copy is freed once loaded


def test_ranks_restoring_one_after_another_each_free_only_their_own_part(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Ranks with state of their own (no replicated objects, e.g. pipeline stages): the first
    # to load frees its part at once; a slower rank must not then trip over the part gone.
    parts = [torch.nn.Linear(4, 1 + r) for r in range(2)]
    for r, part in enumerate(parts):
        ckpt = Checkpointer(rank=r, world_size=2, model=part)
        ckpt.step = 7
        imageformat.stage(tmp_path, r, 2, 7, ckpt.snapshot())
    (tmp_path / control.READY).touch()
    monkeypatch.setenv(control.ENV_RESTORE_DIR, str(tmp_path))
    for r, part in enumerate(parts):
        fresh = torch.nn.Linear(4, 1 + r)
        assert Checkpointer(rank=r, world_size=2, model=fresh).restore() == 7
        assert torch.equal(fresh.weight, part.weight)
        assert not imageformat.index_path(tmp_path, r).exists()


def test_a_restore_that_failed_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / control.FAILED).write_text("image img-1: chunk missing")
    monkeypatch.setenv(control.ENV_RESTORE_DIR, str(tmp_path))
    with pytest.raises(RuntimeError, match="chunk missing"):
        Checkpointer(model=torch.nn.Linear(2, 2)).restore()


def test_the_safe_point_serves_a_checkpoint_and_training_goes_on(control_dir: Path, tmp_path: Path) -> None:
    ckpt = Checkpointer(model=torch.nn.Linear(4, 4))
    assert control.registrations(control_dir)[0]["world_size"] == 1
    control.write_request(control_dir, control.Request(1, control.CHECKPOINT, time.time() + 5, str(tmp_path / "st")))
    ckpt.safe_point(7)
    ack = control.read_acks(control_dir, 1)[0]
    assert ack["ok"] and ack["step"] == 7 and ack["bytes"] > 0
    assert imageformat.read_index(tmp_path / "st", 0)["step"] == 7
    ckpt.safe_point(8)  # served once only
    assert imageformat.read_index(tmp_path / "st", 0)["step"] == 7


def signalled_acks(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the job has written an ack (to its control folder, as before)."""
    acked = threading.Event()
    write_ack = control.write_ack

    def write_and_signal(*args: Any, **answer: Any) -> None:
        write_ack(*args, **answer)
        acked.set()

    monkeypatch.setattr(control, "write_ack", write_and_signal)
    return acked


def test_a_committed_pause_ends_the_process_at_the_safe_point(
    control_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acked = signalled_acks(monkeypatch)
    ckpt = Checkpointer(model=torch.nn.Linear(4, 4), fast_exit=False)
    control.write_request(control_dir, control.Request(1, control.PAUSE, time.time() + 5, str(tmp_path / "st")))

    def agent() -> None:
        assert acked.wait(5)  # the agent's side: it decides once the job has answered
        assert control.read_acks(control_dir, 1)
        control.write_decision(control_dir, 1, control.COMMIT)

    threading.Thread(target=agent, daemon=True).start()
    with pytest.raises(Paused) as paused:
        ckpt.safe_point(4)
    assert paused.value.code == 0 and paused.value.step == 4


def test_a_pause_with_no_decision_is_abandoned_after_a_bounded_wait(
    control_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "DECISION_GRACE_S", 0.2)
    ckpt = Checkpointer(model=torch.nn.Linear(4, 4), fast_exit=False)
    control.write_request(control_dir, control.Request(1, control.PAUSE, time.time() + 0.3, str(tmp_path / "st")))
    started = time.monotonic()
    ckpt.safe_point(1)  # no agent decides: the job trains on
    assert time.monotonic() - started < 2.0
    ckpt.safe_point(2)


def test_a_request_past_its_deadline_is_not_served(control_dir: Path, tmp_path: Path) -> None:
    ckpt = Checkpointer(model=torch.nn.Linear(4, 4))
    control.write_request(control_dir, control.Request(1, control.PAUSE, time.time() - 1, str(tmp_path / "st")))
    ckpt.safe_point(1)
    assert control.read_acks(control_dir, 1) == {}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentCheckpoints, LocalJob]]:
    home = tmp_path / "agent"
    home.mkdir()
    table = ProcessTable("n1", home, home / "lease", 60)
    settings = CheckpointSettings(store_dir=tmp_path / "chunks", fsync=False, staging_root=tmp_path / "staging")
    checkpoints = AgentCheckpoints("n1", table, home, settings)
    folder = home / "jobs" / "j-1-3"
    (folder / "control").mkdir(parents=True)
    # A job that runs as long as this test: our own process group.
    job = LocalJob("j-1", 3, [0], os.getpgid(0), folder)
    table.jobs["j-1"] = job
    try:
        yield checkpoints, job
    finally:
        checkpoints.close()


def test_a_rank_that_misses_the_safe_point_fails_the_pause_and_every_rank_carries_on(
    agent: tuple[AgentCheckpoints, LocalJob], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints, job = agent
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(job.folder / "control"))
    rank0 = Checkpointer(model=torch.nn.Linear(4, 4), rank=0, world_size=2, fast_exit=False)
    control.register(job.folder / "control", 1, 2)  # rank 1 registered, then never reaches a safe point
    steps: list[int] = []
    stepped = threading.Condition()
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            rank0.safe_point(step)  # would raise Paused on a commit
            with stepped:
                steps.append(step)
                stepped.notify_all()

    worker = threading.Thread(target=train, daemon=True)
    worker.start()
    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match=r"ranks \[1\] of 2 did not reach a safe point within 1s"):
        checkpoints._quiesce(job, "img-x", True, 1.0, False)
    assert time.monotonic() - started < 3.0
    with stepped:
        seen = len(steps)
        trained_on = stepped.wait_for(lambda: len(steps) > seen, timeout=5)
    stop.set()
    worker.join(5)
    assert trained_on  # rank 0 acked, was told "abort", and trained on
    assert control.decision_path(job.folder / "control", 1).read_text() == control.ABORT
    assert not (job.folder / "paused").exists() and checkpoints.status("img-x") is None


def test_a_job_that_never_registered_cannot_be_checkpointed(agent: tuple[AgentCheckpoints, LocalJob]) -> None:
    checkpoints, job = agent
    with pytest.raises(FailedPrecondition, match="has not registered its state with rota.runtime"):
        checkpoints._quiesce(job, "img-y", False, 0.3, False)
    assert checkpoints._quiesce(job, "img-z", False, 5.0, True) is None  # periodic: skipped at once
