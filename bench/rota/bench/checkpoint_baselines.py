"""The framework checkpoints `rota bench checkpoint` measures Rota against, each in the
same run as Rota's arms, on the same job (rota.bench.checkpoint_job) and the same ranks:

- torch.save by rank 0, the go to every rank gone (save_s); then three loaders of that
  file, each to its first step done: a cold launch with torch.load (load_s), a cold launch
  with torch.load(mmap=True), the tensors assigned in place (load_mmap_s), and a loader
  pre-started before the save (interpreter up, imports done, waiting for the file; as a
  warm runtime is) with torch.load(mmap=True), from the file complete (load_prestarted_s);
- safetensors: save_file by rank 0 (safetensors_save_s) and a cold launch with load_file
  (safetensors_load_s);
- dcp.async_save on every rank: how long it blocks the ranks (async_block_s).

The savers start from the case's image (mapped, as a restore does), not from a fresh random
state: the same bytes, without paying the state's generation three more times a repeat.

The page cache is treated alike: every file is read right after it was written, from the
page cache, by Rota and the baselines (no side drops caches); `--fsync` syncs both
(os.fsync after torch.save and save_file, the store's fsync per chunk).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rota.bench.checkpoint import Case, Runner

WAIT_S = 600.0


async def torch_baselines(runner: Runner, case: Case, command: list[str]) -> None:
    path = runner.work / "state.pt"
    done = Path(f"{path}.done")  # the pre-started loader's signal: the file is complete
    saver = runner.launch(runner.a, [*command, "--save", str(path)], runner.image, job_id="save")
    await runner.first_step(saver, 0)
    loader = runner.launch(runner.b, [*command, "--load-mmap", str(path), "--wait-for", str(done)], job_id="pre")
    await wait_file(Path(f"{done}.ready"))
    started = time.perf_counter()
    Path(f"{path}.go").touch()
    await runner.gone(saver)
    saved = time.perf_counter()
    done.touch()
    case.save.append(saved - started)
    case.baseline_bytes = path.stat().st_size
    await runner.first_step(loader, 0)
    case.load_prestarted.append(time.perf_counter() - saved)
    runner.b.table.stop("pre", loader.epoch, "measured", 5)
    for flag, times in (("--load", case.load), ("--load-mmap", case.load_mmap)):
        started = time.perf_counter()
        job = runner.launch(runner.b, [*command, flag, str(path)])
        await runner.first_step(job, 0)
        times.append(time.perf_counter() - started)
        runner.b.table.stop("bench", job.epoch, "measured", 5)
    for leftover in (path, Path(f"{path}.go"), done, Path(f"{done}.ready")):
        leftover.unlink(missing_ok=True)


async def safetensors_baseline(runner: Runner, case: Case, command: list[str]) -> None:
    path = runner.work / "state.safetensors"
    saver = runner.launch(runner.a, [*command, "--st-save", str(path)], runner.image, job_id="save")
    await runner.first_step(saver, 0)
    started = time.perf_counter()
    Path(f"{path}.go").touch()
    await runner.gone(saver)
    case.st_save.append(time.perf_counter() - started)
    started = time.perf_counter()
    job = runner.launch(runner.b, [*command, "--st-load", str(path)])
    await runner.first_step(job, 0)
    case.st_load.append(time.perf_counter() - started)
    runner.b.table.stop("bench", job.epoch, "measured", 5)
    for leftover in (path, Path(f"{path}.go")):
        leftover.unlink(missing_ok=True)


async def dcp_baseline(runner: Runner, case: Case, command: list[str]) -> None:
    """How long dcp.async_save blocks the ranks: to compare with Rota's pause."""
    path = runner.work / "dcp"
    job = runner.launch(runner.a, [*command, "--dcp-async", str(path)], runner.image, job_id="save")
    await runner.first_step(job, 0)
    Path(f"{path}.go").touch()
    await runner.gone(job)
    case.dcp_async_block.append(float(Path(f"{path}.block").read_text()))
    shutil.rmtree(path, ignore_errors=True)
    for suffix in (".go", ".block"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        await asyncio.sleep(0.002)
