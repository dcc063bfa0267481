"""The agent's warm runtime (rota.agent.warm_runtime) with real processes: a job handed to
the warm interpreter sees what a cold launch gives it (argv, environment, folder, log, exit
code, its own process group for Stop), a job the warm path cannot run starts cold, and a
training job paused and restored through the warm runtime ends with the same weights as the
same job run through without a pause."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import polling
import pytest

from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.processes import LocalJob, ProcessTable
from rota.imagestore.settings import CheckpointSettings

PY = sys.executable
STEPS = 40  # the training job's last step

# A tiny regression trained with Adam on data that depends only on the step: the weights
# after STEPS steps are the same however often the job was paused and restored.
TRAIN = f"""
import json, os, sys, time
import torch
import rota.runtime

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
ckpt = rota.runtime.Checkpointer(model=model, optimizer=opt)
step = ckpt.restore()
restored_at = step
while step < {STEPS}:
    step += 1
    x = torch.linspace(-1, 1, 64).reshape(8, 8) * step / {STEPS}
    loss = ((model(x).squeeze(1) - x.sum(1)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    rota.runtime.report(step=step)
    ckpt.safe_point(step)
    time.sleep(float(os.environ.get("STEP_S", "0")))
out = {{"weights": [float(v) for v in model.weight.flatten().tolist()] + [float(model.bias.item())],
       "restored_at": restored_at, "warm": "torch" in sys.modules and sys.argv[0].endswith("train.py")}}
open(sys.argv[1], "w").write(json.dumps(out))
"""


def wait_until(predicate: Callable[[], bool], timeout: float = 120.0) -> bool:
    return polling.wait_until(predicate, timeout, 0.02)


def wait_exit(job: LocalJob, timeout: float = 120.0) -> int:
    assert wait_until(lambda: job.exit_code() is not None, timeout), f"{job.job_id} still running: {job.error()}"
    code = job.exit_code()
    assert code is not None
    return code


def step_of(job: LocalJob) -> int:
    line = job.progress_json()
    return int(json.loads(line)["step"]) if line else 0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[ProcessTable, AgentCheckpoints]]:
    home = tmp_path / "node"
    home.mkdir()
    (home / "lease").touch()
    table = ProcessTable("warm-node", home, home / "lease", 3600)  # no agent beats the lease here
    settings = CheckpointSettings(store_dir=tmp_path / "chunks", chunk_size=256 * 1024, fsync=False,
                                  staging_root=tmp_path / "shm" / "warm-node")
    checkpoints = AgentCheckpoints("warm-node", table, home, settings)
    pool = table.start_warm_runtime()
    assert pool.wait_ready(120), "the warm runtime did not finish its imports"
    yield table, checkpoints
    table.stop_all("test done", 5)
    pool.close()
    checkpoints.close()


def test_a_handed_job_sees_its_argv_environment_folder_log_and_exit_code(
        node: tuple[ProcessTable, AgentCheckpoints], tmp_path: Path) -> None:
    table, _ = node
    assert table.warm is not None
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'job': os.environ['ROTA_JOB_ID'],"
                      " 'extra': os.environ['EXTRA'], 'pgid': os.getpgid(0), 'torch': 'torch' in sys.modules}))\n"
                      "sys.exit(7)\n")
    job = table.launch("show", 1, [0], [PY, str(script), "a", "b"], str(tmp_path), {"EXTRA": "x"}, True)
    assert wait_exit(job) == 7
    seen = json.loads(job.log_path.read_text().strip().splitlines()[-1])
    assert table.warm.handed == 1
    assert seen == {"argv": ["a", "b"], "cwd": str(tmp_path), "job": "show", "extra": "x", "pgid": job.pgid,
                    "torch": True}  # torch came imported: the warm interpreter ran it
    assert (job.folder / "exit").read_text().split()[0] == "7"


def test_a_module_job_fails_with_its_traceback_and_stop_ends_its_group(
        node: tuple[ProcessTable, AgentCheckpoints], tmp_path: Path) -> None:
    table, _ = node
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    failed = table.launch("boom", 1, [0], [PY, "-m", "boom"], str(tmp_path), {}, True)
    assert wait_exit(failed) == 1
    assert "RuntimeError: boom at import" in failed.log_path.read_text()
    assert table.warm is not None and table.warm.wait_ready(120)
    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    sleeper = table.launch("sleeper", 1, [1], [PY, "-m", "sleeper"], str(tmp_path), {}, True)
    assert wait_until(lambda: "up" in sleeper.log_path.read_text())
    assert table.stop("sleeper", 1, "stopped by the test", 5)
    assert wait_exit(sleeper) != 0 and table.warm.handed == 2


def test_a_job_the_warm_path_cannot_run_starts_cold(node: tuple[ProcessTable, AgentCheckpoints],
                                                    tmp_path: Path) -> None:
    table, _ = node
    assert table.warm is not None
    job = table.launch("inline", 1, [0], [PY, "-c", "print('cold')"], str(tmp_path), {}, True)
    other = table.launch("path", 1, [1], [PY, str(tmp_path / "x.py")], str(tmp_path), {"PYTHONPATH": "/elsewhere"},
                         True)
    assert wait_exit(job) == 0 and "cold" in job.log_path.read_text()
    assert wait_exit(other) != 0  # no such file: a cold interpreter's own error
    assert table.warm.handed == 0


def test_a_job_restored_through_the_warm_runtime_ends_as_the_uninterrupted_run(
        node: tuple[ProcessTable, AgentCheckpoints], tmp_path: Path) -> None:
    table, checkpoints = node
    assert table.warm is not None
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    straight = table.launch("straight", 1, [0], [PY, str(script), str(tmp_path / "straight.json")], str(tmp_path),
                            {}, True)
    assert wait_exit(straight) == 0, straight.error()
    assert table.warm.wait_ready(120)
    paused = table.launch("train", 1, [1], [PY, str(script), str(tmp_path / "paused.json")], str(tmp_path),
                          {"STEP_S": "0.2"}, True)
    assert wait_until(lambda: step_of(paused) >= 3), paused.error()
    record = asyncio.run(checkpoints.checkpoint("train", 1, "img-warm-1", True, 60, False))
    assert record is not None and 3 <= record.step < STEPS
    assert wait_exit(paused) is not None and not (tmp_path / "paused.json").exists()
    assert wait_until(lambda: (checkpoints.status("img-warm-1") or record).state == "complete")
    assert table.warm.wait_ready(120)
    restore = checkpoints.restore_dir("train", 2)
    restored = table.launch("train", 2, [1], [PY, str(script), str(tmp_path / "restored.json")], str(tmp_path),
                            {}, True, restore)
    checkpoints.start_restore(restore, "img-warm-1")
    assert wait_exit(restored) == 0, restored.error()
    assert table.warm.handed == 3  # all three ran in warm interpreters
    reference = json.loads((tmp_path / "straight.json").read_text())
    result = json.loads((tmp_path / "restored.json").read_text())
    assert result["restored_at"] == record.step and reference["restored_at"] == 0
    assert result["warm"] and result["weights"] == reference["weights"]


def test_a_pool_without_refill_warms_at_normal_priority_only_when_asked(tmp_path: Path) -> None:
    """The bench's pool: not replaced on hand-over (no import beside a timed arm), and warmed
    at normal priority; an agent's warms at idle priority."""
    home = tmp_path / "bench-node"
    home.mkdir()
    (home / "lease").touch()
    table = ProcessTable("bench-node", home, home / "lease", 3600)
    pool = table.start_warm_runtime(idle=False, refill=False)
    agents = ProcessTable("agent-node", tmp_path, home / "lease", 3600).start_warm_runtime()
    try:
        assert pool.ready is not None and agents.ready is not None
        assert os.sched_getscheduler(pool.ready.pid) == os.SCHED_OTHER
        assert wait_until(lambda: os.sched_getscheduler(agents.ready.pid) == os.SCHED_IDLE)  # type: ignore[union-attr]
        assert pool.wait_ready(120)
        job = table.launch("one", 1, [0], [PY, "-c", "pass"], str(tmp_path), {}, True)
        (tmp_path / "one.py").write_text("print('ran', flush=True)\n")
        handed = table.launch("two", 1, [1], [PY, "-m", "one"], str(tmp_path), {}, True)
        assert wait_exit(job) == 0 and wait_exit(handed) == 0 and "ran" in handed.log_path.read_text()
        assert pool.handed == 1 and pool.ready is None  # not replaced until the bench asks
        assert pool.wait_ready(120) and pool.ready is not None
    finally:
        table.stop_all("test done", 5)
        pool.close()
        agents.close()
