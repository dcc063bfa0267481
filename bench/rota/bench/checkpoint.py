"""`rota bench checkpoint`: pause, restore and migration latency and bytes stored, beside
plain torch.save / torch.load of the same state, measured in the same run.

    rota bench checkpoint [--json] [--quick] [--sizes 50,500,2048] [--ranks 1,4] [--repeats 3]
    rota bench checkpoint --chunk-sweep [--json]     the measurement behind the default chunk size

Per case (state size: parameters plus Adam's two moments; data-parallel ranks, whose
state is replicated), with two agents' real code (process tables, checkpoint managers)
on a temporary home and a fresh chunk store:

- pause_s: the pause request to every rank process gone (their devices free);
- restore_s: launching the job with the image to its first step done;
- migrate_s: the pause request on node A to the first step done on node B, the image
  written to the store in between (node B reads it from there);
- stored_bytes: what the first image added to an empty store (ranks deduplicated);
- baseline: rank 0 writes the state with torch.save and every rank exits (save_s, the
  same start and end as pause_s); a new launch torch.loads it to its first step done
  (load_s, as restore_s); bytes: the file.

Both sides write to the page cache (torch.save does not fsync); `--fsync` syncs both.
Every time is a median over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.agent.checkpoints import AgentCheckpoints, ImageRecord
from rota.agent.processes import LocalJob, ProcessTable
from rota.imagestore.chunks import DEFAULT_CHUNK_SIZE, MIB
from rota.imagestore.settings import CheckpointSettings, default_staging_root
from rota.runtime import control

FULL_SIZES = (50.0, 500.0, 2048.0)
QUICK_SIZES = (8.0,)
STEP_TIMEOUT_S = 600.0


@dataclass
class Node:
    table: ProcessTable
    checkpoints: AgentCheckpoints


@dataclass
class Case:
    state_mb: float
    ranks: int
    pause: list[float] = field(default_factory=list)
    restore: list[float] = field(default_factory=list)
    migrate: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    stored_bytes: int = 0
    baseline_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_mb": self.state_mb, "ranks": self.ranks, "pause_s": _median(self.pause),
            "restore_s": _median(self.restore), "migrate_s": _median(self.migrate), "stored_bytes": self.stored_bytes,
            "baseline": {"save_s": _median(self.save), "load_s": _median(self.load), "bytes": self.baseline_bytes},
        }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def _node(name: str, home: Path, settings: CheckpointSettings) -> Node:
    home.mkdir(parents=True, exist_ok=True)
    (home / "lease").touch()
    table = ProcessTable(name, home, home / "lease", 1e9)  # the bench keeps no lease: no fencing
    return Node(table, AgentCheckpoints(name, table, home, settings))


class Runner:
    def __init__(self, work: Path, chunk_size: int, fsync: bool) -> None:
        staging = default_staging_root("bench").parent / f"bench-{os.getpid()}"
        self.staging = staging
        self.settings = CheckpointSettings(store_dir=work / "chunks", chunk_size=chunk_size, staging_root=staging,
                                           fsync=fsync)
        self.a = _node("bench-a", work / "a", self.settings)
        self.b = _node("bench-b", work / "b", self.settings)
        self.work = work
        self.epoch = 0

    def launch(self, node: Node, command: list[str], image: str = "") -> tuple[LocalJob, float]:
        self.epoch += 1
        restore = node.checkpoints.restore_dir("bench", self.epoch) if image else None
        started = time.perf_counter()
        job = node.table.launch("bench", self.epoch, [0], command, str(Path.cwd()), {}, True, restore)
        if restore is not None:
            node.checkpoints.start_restore(restore, image)
        return job, started

    async def pause(self, node: Node, job: LocalJob) -> ImageRecord:
        image = f"img-bench-{job.epoch}"
        record = await node.checkpoints.checkpoint("bench", job.epoch, image, True, 300, False)
        assert record is not None
        return record

    @staticmethod
    async def written(node: Node, image: str) -> ImageRecord:
        while True:
            record = node.checkpoints.status(image)
            assert record is not None
            if record.state != "writing":
                if record.state != "complete":
                    raise RuntimeError(f"image {image} failed: {record.error}")
                return record
            await asyncio.sleep(0.005)

    def close(self) -> None:
        for node in (self.a, self.b):
            node.table.stop_all("bench done", 5)
            node.checkpoints.close()
        shutil.rmtree(self.staging, ignore_errors=True)


async def first_step(job: LocalJob, after: int) -> int:
    """Waits for a progress report past step `after`; returns its step."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        line = job.progress_json()
        if line:
            step = int(json.loads(line)["step"])
            if step > after:
                return step
        if job.exit_code() is not None:
            raise RuntimeError(f"the bench job exited ({job.exit_code()}): {job.error()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("the bench job made no progress")
        await asyncio.sleep(0.002)


async def wait_gone(job: LocalJob) -> None:
    pids = [int(r["pid"]) for r in control.registrations(job.folder / "control").values()]
    while any(Path(f"/proc/{p}").exists() and _state(p) != "Z" for p in pids):
        await asyncio.sleep(0.002)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"


async def run_case(case: Case, repeats: int, chunk_size: int, base: Path, fsync: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="rota-bench-ckpt-", dir=base))
    runner = Runner(work, chunk_size, fsync)
    command = [sys.executable, "-m", "rota.bench.checkpoint_job", "--state-mb", str(case.state_mb),
               "--ranks", str(case.ranks), *(["--fsync"] if fsync else [])]
    try:
        for repeat in range(repeats):
            job, _ = runner.launch(runner.a, command)
            step = await first_step(job, 0)
            record = await runner.pause(runner.a, job)
            case.pause.append(record.pause_s)
            written = await runner.written(runner.a, record.image_id)
            if repeat == 0:
                case.stored_bytes = written.written_bytes  # an empty store: ranks deduplicated only
            job, started = runner.launch(runner.a, command, record.image_id)
            step = await first_step(job, record.step)
            case.restore.append(time.perf_counter() - started)
            started = time.perf_counter()
            record = await runner.pause(runner.a, job)
            await runner.written(runner.a, record.image_id)
            job, _ = runner.launch(runner.b, command, record.image_id)
            await first_step(job, record.step)
            case.migrate.append(time.perf_counter() - started)
            runner.b.table.stop("bench", job.epoch, "measured", 5)
            await baseline(runner, case, command, step)
    finally:
        runner.close()
        shutil.rmtree(work, ignore_errors=True)


async def baseline(runner: Runner, case: Case, command: list[str], after: int) -> None:
    path = runner.work / "state.pt"
    job, _ = runner.launch(runner.a, [*command, "--save", str(path)])
    await first_step(job, 0)
    started = time.perf_counter()
    Path(f"{path}.go").touch()
    await wait_gone(job)
    case.save.append(time.perf_counter() - started)
    case.baseline_bytes = path.stat().st_size
    job, started = runner.launch(runner.b, [*command, "--load", str(path)])
    await first_step(job, 0)
    case.load.append(time.perf_counter() - started)
    runner.b.table.stop("bench", job.epoch, "measured", 5)
    path.unlink()
    Path(f"{path}.go").unlink()


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def fits(state_mb: float, ranks: int) -> bool:
    # Live state, its tmpfs copy and a restoring rank's second copy, per rank, plus room.
    return ranks * state_mb * MIB * 2.3 + (1 << 30) < available_bytes()


def render(cases: list[dict[str, Any]]) -> str:
    head = ("STATE", "RANKS", "PAUSE", "SAVE", "x", "RESTORE", "LOAD", "x", "MIGRATE", "SAVE+LOAD", "x", "STORED", "TORCH.SAVE")
    rows = []
    for c in cases:
        b = c["baseline"]
        both = b["save_s"] + b["load_s"]
        rows.append((
            f"{c['state_mb']:g} MB", c["ranks"], f"{c['pause_s']:.3f}s", f"{b['save_s']:.3f}s",
            f"{b['save_s'] / c['pause_s']:.1f}", f"{c['restore_s']:.2f}s", f"{b['load_s']:.2f}s",
            f"{b['load_s'] / c['restore_s']:.1f}", f"{c['migrate_s']:.2f}s", f"{both:.2f}s",
            f"{both / c['migrate_s']:.1f}", f"{c['stored_bytes'] / MIB:.1f} MiB", f"{b['bytes'] / MIB:.1f} MiB",
        ))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)) for r in (head, *rows)]
    return "\n".join(lines) + "\n(x: the baseline's time over ours; higher is better)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rota bench checkpoint", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--json", action="store_true", help="print the cases as JSON")
    p.add_argument("--quick", action="store_true", help="a small state, one repeat (CI)")
    p.add_argument("--sizes", default=None, help="state sizes in MB, comma-separated (default 50,500,2048)")
    p.add_argument("--ranks", default="1,4", help="data-parallel ranks, comma-separated (default 1,4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_SIZE / MIB)
    p.add_argument("--dir", default=None, help="where the store and the baseline's file go (default: a temp dir)")
    p.add_argument("--fsync", action="store_true",
                   help="sync to disk on both sides (the store's fsync, os.fsync after torch.save); default: neither")
    p.add_argument("--chunk-sweep", action="store_true", help="measure chunk sizes instead (rota.bench.checkpoint_chunks)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.chunk_sweep:
        from rota.bench.checkpoint_chunks import main as sweep

        return sweep(json_out=args.json)
    sizes = QUICK_SIZES if args.quick and not args.sizes else tuple(float(s) for s in (args.sizes or "50,500,2048").split(","))
    ranks = tuple(int(r) for r in args.ranks.split(","))
    repeats = 1 if args.quick else max(1, args.repeats)
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    out: list[dict[str, Any]] = []
    for size in sizes:
        for r in ranks:
            if not fits(size, r):
                print(f"skipped {size:g} MB x {r} ranks: needs about {r * size * 2.3 / 1024:.1f} GiB of memory, "
                      f"{available_bytes() / (1 << 30):.1f} GiB available", file=sys.stderr)
                continue
            case = Case(size, r)
            asyncio.run(run_case(case, repeats, int(args.chunk_mb * MIB), base, args.fsync))
            out.append(case.to_dict())
            if not args.json:
                print(f"done: {size:g} MB x {r} ranks", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"cases": out}, indent=2))
    else:
        print(render(out))
    return 0
