"""The framework checkpoints `rota bench checkpoint` measures Rota against, each in the
same run as Rota's arms, on the same job (rota.bench.checkpoint_job) and the same ranks:

- torch.save by rank 0, the go to every rank gone (save_s); safetensors' save_file by rank 0
  (safetensors_save_s);
- pre-started loaders, one per format, started before the saves and waiting for their file
  with their interpreter up and the warm runtime's imports done (Rota's restore starts from
  a warm runtime: the baselines start as warm): torch.load (load_prestarted_copy_s),
  torch.load(mmap=True) with the tensors assigned in place (load_prestarted_s), safetensors'
  load_file (safetensors_prestarted_s), each from its file complete to its first step done.
  The pre-started torch.load, which copies the state (never the best baseline: 10-30x the
  mapped loaders here), is measured in the first repeat only;
- cold launches of the same loaders (load_s, load_mmap_s, safetensors_load_s): the launch
  to the first step done; they pay the interpreter's start, so they are measured in the
  first repeat only, and not by --quick (0.0: not measured);
- dcp.async_save on every rank: how long it blocks the ranks (async_block_s), first repeat.

Every loader's first step reads every byte of the state on every rank before it reports
(rota.bench.checkpoint_job.touch_every_byte), as Rota's restored job does: a mapped load
(torch.load(mmap=True), Rota's image) has restored nothing until its pages are read.

The savers start from the case's image (mapped, as a restore does), not from a fresh random
state: the same bytes, without paying the state's generation more times a repeat.

The page cache is treated alike: warm, every file is read right after it was written, by
Rota and the baselines (no side drops caches); `--fsync` syncs both (os.fsync after
torch.save and save_file, the store's fsync per chunk).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rota.agent.processes import LocalJob
    from rota.bench.checkpoint import Runner
    from rota.bench.checkpoint_report import Case

WAIT_S = 600.0
# Pre-started torch loaders: (the job's flag, the Case list their times go to).
TORCH_LOADERS = (("--load", "load_prestarted_copy"), ("--load-mmap", "load_prestarted"))


async def file_baselines(runner: Runner, case: Case, command: list[str], first: bool, cold: bool) -> None:
    """torch.save and safetensors, each with its pre-started loaders (the copying torch.load
    one in the `first` repeat only), and cold ones if `cold`."""
    pt, st = runner.work / "state.pt", runner.work / "state.safetensors"
    torch_loaders = TORCH_LOADERS if first else [x for x in TORCH_LOADERS if x[1] != "load_prestarted_copy"]
    waiting = [(flag, pt, name) for flag, name in torch_loaders] + [("--st-load", st, "st_prestarted")]
    loaders: list[tuple[LocalJob, Path, str]] = []
    with runner.phase("loaders_start"):
        for flag, path, name in waiting:  # all importing at once, before anything is timed
            done = runner.work / f"{name}.done"
            job = runner.launch(runner.b, [*command, flag, str(path), "--wait-for", str(done)], job_id=name)
            loaders.append((job, done, name))
        for _, done, _ in loaders:
            await wait_file(Path(f"{done}.ready"))
    with runner.phase("saves"):
        await save(runner, case, command, "--save", pt, case.save)
        case.baseline_bytes = pt.stat().st_size
        await save(runner, case, command, "--st-save", st, case.st_save)
    for job, done, name in loaders:
        started = time.perf_counter()
        done.touch()
        await runner.first_step(job, 0)
        getattr(case, name).append(time.perf_counter() - started)
        runner.b.table.stop(name, job.epoch, "measured", 5)
    if cold:
        with runner.phase("cold_loads"):
            for flag, path, name in (("--load", pt, "load"), ("--load-mmap", pt, "load_mmap"), ("--st-load", st, "st_load")):
                started = time.perf_counter()
                job = runner.launch(runner.b, [*command, flag, str(path)])
                await runner.first_step(job, 0)
                getattr(case, name).append(time.perf_counter() - started)
                runner.b.table.stop("bench", job.epoch, "measured", 5)
    for leftover in runner.work.iterdir():
        if leftover.is_file():
            leftover.unlink(missing_ok=True)


async def save(runner: Runner, case: Case, command: list[str], flag: str, path: Path, times: list[float]) -> None:
    """Rank 0 saves the state in the format `flag` names; the go to every rank gone."""
    saver = runner.launch(runner.a, [*command, flag, str(path)], runner.image, job_id="save")
    await runner.first_step(saver, 0)
    started = time.perf_counter()
    Path(f"{path}.go").touch()
    await runner.gone(saver)
    times.append(time.perf_counter() - started)


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
