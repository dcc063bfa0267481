"""`rota bench checkpoint`: pause, restore and migration latency and bytes stored, beside
plain torch.save / torch.load of the same state, measured in the same run.

    rota bench checkpoint [--json] [--quick] [--sizes 50,500,2048] [--ranks 1,4] [--repeats 3]
    rota bench checkpoint --chunk-sweep [--json]     the measurement behind the default chunk size
    rota bench checkpoint --gpu [--sizes ..] [--json] a CUDA model's state against torch.save/load

Per case (state size: parameters plus Adam's two moments; data-parallel ranks, whose
state is replicated), with two agents' real code (process tables, checkpoint managers)
on a temporary home and a fresh chunk store:

- pause_s: the pause request to every rank process gone (their devices free): the time
  the job is blocked, to compare with dcp.async_save's blocking time;
- durable_s: the pause request to the image complete in the store and restorable (the
  hash and write after the ranks exit included), to compare with torch.save and dcp.save;
- restore_s: launching the job with the image to its first step done, and
  restore_breakdown: where it went (process start and imports until restore() is
  called; state transfer: waiting there for the agent's image; rebuild: reading and
  applying the state; first step);
- migrate_s: the pause request on node A to the first step done on node B, with a warm
  target: B's process is launched with the pause request and takes the staged copy
  (hard links: one host) while A's agent writes it to the store;
- migrate_stream_s: the same with node C, which shares no staging folder with A (as on
  another machine): C's agent streams the staged copy from A's AgentService over gRPC
  (rota.agent.streaming; loopback here), taking what the write has already stored from the
  store, while the write goes on;
- stored_bytes: what the first image added to an empty store (ranks deduplicated);
- baseline: rank 0 writes the state with torch.save and every rank exits (save_s, the
  same start and end as pause_s); a new launch torch.loads it to its first step done
  (load_s, as restore_s); bytes: the file;
- dcp: torch.distributed.checkpoint of the same state on the same ranks: dcp.save to
  every rank gone (save_s), how long dcp.async_save blocks the ranks (async_block_s), a
  new launch from dcp.load to its first step done (load_s).

Both sides write to the page cache (torch.save does not fsync); `--fsync` syncs both.
Every time is a median over the repeats; `spread` holds [min, max] of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rota.agent.checkpoints import AgentCheckpoints, ImageRecord
from rota.agent.processes import LocalJob, ProcessTable
from rota.agent.streaming import StagedStreams
from rota.bench.agent_server import AgentServer
from rota.imagestore.chunks import DEFAULT_CHUNK_SIZE, MIB
from rota.imagestore.settings import CheckpointSettings, default_staging_root
from rota.jobfiles import control

FULL_SIZES = (50.0, 500.0, 2048.0)
QUICK_SIZES = (8.0,)
STEP_TIMEOUT_S = 600.0
# A restore's time: the process start and imports until restore() is called, waiting there
# for the agent's image (state transfer), reading and applying it (rebuild), the first step.
BREAKDOWN = ("process_start_s", "state_transfer_s", "rebuild_s", "first_step_s")


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
    migrate_stream: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    durable: list[float] = field(default_factory=list)
    dcp_save: list[float] = field(default_factory=list)
    dcp_async_block: list[float] = field(default_factory=list)
    dcp_load: list[float] = field(default_factory=list)
    breakdown: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in BREAKDOWN})
    stored_bytes: int = 0
    baseline_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        timed = {"pause_s": self.pause, "durable_s": self.durable, "restore_s": self.restore,
                 "migrate_s": self.migrate, "migrate_stream_s": self.migrate_stream, "save_s": self.save, "load_s": self.load, "dcp_save_s": self.dcp_save,
                 "dcp_async_block_s": self.dcp_async_block, "dcp_load_s": self.dcp_load}
        return {
            "state_mb": self.state_mb, "ranks": self.ranks, "pause_s": _median(self.pause),
            "restore_s": _median(self.restore), "migrate_s": _median(self.migrate),
            "migrate_stream_s": _median(self.migrate_stream), "stored_bytes": self.stored_bytes,
            "baseline": {"save_s": _median(self.save), "load_s": _median(self.load), "bytes": self.baseline_bytes},
            "durable_s": _median(self.durable),
            "dcp": {"save_s": _median(self.dcp_save), "async_block_s": _median(self.dcp_async_block),
                    "load_s": _median(self.dcp_load)},
            "restore_breakdown": {k: _median(v) for k, v in self.breakdown.items()},
            "repeats": len(self.pause),
            "spread": {k: [_round(min(v)), _round(max(v))] for k, v in timed.items() if v},
        }


def _round(value: float) -> float:
    return round(value, 4)


def _median(values: list[float]) -> float:
    return _round(statistics.median(values)) if values else 0.0


def _node(name: str, home: Path, settings: CheckpointSettings, streams: StagedStreams | None = None) -> Node:
    home.mkdir(parents=True, exist_ok=True)
    (home / "lease").touch()
    table = ProcessTable(name, home, home / "lease", 1e9)  # the bench keeps no lease: no fencing
    return Node(table, AgentCheckpoints(name, table, home, settings, streams))


class Runner:
    def __init__(self, work: Path, chunk_size: int, fsync: bool) -> None:
        staging = default_staging_root("bench").parent / f"bench-{os.getpid()}"
        self.staging = staging
        self.settings = CheckpointSettings(store_dir=work / "chunks", chunk_size=chunk_size, staging_root=staging,
                                           fsync=fsync)
        self.a = _node("bench-a", work / "a", self.settings)
        self.b = _node("bench-b", work / "b", self.settings)
        # Node C: staging of its own (so no hard links from A's), streaming from A's AgentService.
        token = secrets.token_hex(16)
        self.c_staging = staging.parent / f"bench-{os.getpid()}-c"
        self.c = _node("bench-c", work / "c", replace(self.settings, staging_root=self.c_staging / "c"),
                       StagedStreams(token))
        self.source = AgentServer(self.a.checkpoints, token)
        self.work = work
        self.epoch = 0
        self.launched_unix = 0.0

    def launch(self, node: Node, command: list[str], image: str = "", wait_s: float = 0.0,
               source: str = "") -> tuple[LocalJob, float]:
        self.epoch += 1
        restore = node.checkpoints.restore_dir("bench", self.epoch) if image else None
        started = time.perf_counter()
        self.launched_unix = time.time()
        job = node.table.launch("bench", self.epoch, [0], command, str(Path.cwd()), {}, True, restore)
        if restore is not None:
            node.checkpoints.start_restore(restore, image, wait_s, source)
        return job, started

    async def pause(self, node: Node, job: LocalJob) -> ImageRecord:
        image = image_of(job)
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

    async def migrate(self, job: LocalJob, target: Node, command: list[str], source: str = "") -> tuple[float, str]:
        """A migration from A with a warm target: the target's process starts (imports,
        builds its model) while A's ranks copy their state, and takes it as soon as it is
        there (hard links on one host, or streamed from `source`), the durable write going
        on meanwhile. Its seconds to the first step on the target, and the image."""
        started = time.perf_counter()
        moved, _ = self.launch(target, command, image_of(job), wait_s=STEP_TIMEOUT_S, source=source)
        record = await self.pause(self.a, job)
        await first_step(moved, record.step)
        seconds = time.perf_counter() - started
        await self.written(self.a, record.image_id)
        target.table.stop("bench", moved.epoch, "measured", 5)
        return seconds, record.image_id

    def close(self) -> None:
        self.source.stop()
        for node in (self.a, self.b, self.c):
            node.table.stop_all("bench done", 5)
            node.checkpoints.close()
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.c_staging, ignore_errors=True)


def image_of(job: LocalJob) -> str:
    """The image id the bench pauses a launch into: known before the pause (a warm target's)."""
    return f"img-bench-{job.epoch}"


async def first_step(job: LocalJob, after: int) -> int:
    """Waits for a progress report past step `after`; returns its step."""
    return int((await first_report(job, after))["step"])


async def first_report(job: LocalJob, after: int) -> dict[str, Any]:
    """Waits for a progress report past step `after`; returns it."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        line = job.progress_json()
        if line:
            report: dict[str, Any] = json.loads(line)
            if int(report["step"]) > after:
                return report
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
            started = time.perf_counter()
            record = await runner.pause(runner.a, job)
            case.pause.append(record.pause_s)
            written = await runner.written(runner.a, record.image_id)
            case.durable.append(time.perf_counter() - started)
            if repeat == 0:
                case.stored_bytes = written.written_bytes  # an empty store: ranks deduplicated only
            job, started = runner.launch(runner.a, command, record.image_id)
            launched = runner.launched_unix
            report = await first_report(job, record.step)
            case.restore.append(time.perf_counter() - started)
            step = int(report["step"])
            add_breakdown(case, report, launched)
            seconds, image = await runner.migrate(job, runner.b, command)
            case.migrate.append(seconds)
            # The same to node C, streamed node to node, from a job on A again.
            job, _ = runner.launch(runner.a, command, image)
            await first_step(job, 0)
            seconds, _ = await runner.migrate(job, runner.c, command, source=runner.source.address)
            case.migrate_stream.append(seconds)
            await baseline(runner, case, command, step)
            await dcp_baseline(runner, case, command, fsync)
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


def add_breakdown(case: Case, report: dict[str, Any], launched_unix: float) -> None:
    """The restored job's own times (see rota.bench.checkpoint_job) as the four phases."""
    marks = [launched_unix, *(float(report.get(k, 0.0)) for k in ("t_restore", "t_ready", "t_loaded", "t_step"))]
    if not all(marks):
        return
    for name, (a, b) in zip(BREAKDOWN, zip(marks, marks[1:], strict=False), strict=True):
        case.breakdown[name].append(max(0.0, b - a))


async def dcp_baseline(runner: Runner, case: Case, command: list[str], fsync: bool) -> None:
    """torch.distributed.checkpoint of the same state on the same ranks: dcp.save (to
    every rank gone, as save_s), dcp.async_save's blocking time, dcp.load (as load_s)."""
    for mode in ("--dcp-save", "--dcp-async"):
        path = runner.work / f"dcp{mode}"
        job, _ = runner.launch(runner.a, [*command, mode, str(path)])
        await first_step(job, 0)
        started = time.perf_counter()
        Path(f"{path}.go").touch()
        await wait_gone(job)
        if mode == "--dcp-save":
            case.dcp_save.append(time.perf_counter() - started)
        else:
            case.dcp_async_block.append(float(Path(f"{path}.block").read_text()))
    job, started = runner.launch(runner.b, [*command, "--dcp-load", str(runner.work / "dcp--dcp-async")])
    await first_step(job, 0)
    case.dcp_load.append(time.perf_counter() - started)
    runner.b.table.stop("bench", job.epoch, "measured", 5)
    for mode in ("--dcp-save", "--dcp-async"):
        path = runner.work / f"dcp{mode}"
        shutil.rmtree(path, ignore_errors=True)
        for suffix in (".go", ".block"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def fits(state_mb: float, ranks: int) -> bool:
    # Live state, its tmpfs copy and a restoring rank's second copy, per rank, plus room.
    return ranks * state_mb * MIB * 2.3 + (1 << 30) < available_bytes()


def render(cases: list[dict[str, Any]]) -> str:
    """Medians with [min-max] beside each; x: the baseline's time over ours (higher is better)."""
    def t(c: dict[str, Any], key: str, value: float) -> str:
        lo, hi = c.get("spread", {}).get(key, [value, value])
        return f"{value:.3f}s [{lo:.3f}-{hi:.3f}]"

    head = ("STATE", "RANKS", "PAUSE", "DCP.ASYNC", "x", "DURABLE", "SAVE", "x", "DCP.SAVE", "x", "RESTORE", "LOAD", "x",
            "DCP.LOAD", "x", "MIGRATE", "SAVE+LOAD", "x", "STREAMED", "x", "STORED", "TORCH.SAVE")
    rows = []
    for c in cases:
        b, d = c["baseline"], c["dcp"]
        both = b["save_s"] + b["load_s"]
        rows.append((
            f"{c['state_mb']:g} MB", c["ranks"], t(c, "pause_s", c["pause_s"]),
            t(c, "dcp_async_block_s", d["async_block_s"]), _x(d["async_block_s"], c["pause_s"]),
            t(c, "durable_s", c["durable_s"]), t(c, "save_s", b["save_s"]), _x(b["save_s"], c["durable_s"]),
            t(c, "dcp_save_s", d["save_s"]), _x(d["save_s"], c["durable_s"]),
            t(c, "restore_s", c["restore_s"]), t(c, "load_s", b["load_s"]), _x(b["load_s"], c["restore_s"]),
            t(c, "dcp_load_s", d["load_s"]), _x(d["load_s"], c["restore_s"]),
            t(c, "migrate_s", c["migrate_s"]), f"{both:.3f}s", _x(both, c["migrate_s"]),
            t(c, "migrate_stream_s", c.get("migrate_stream_s", 0.0)), _x(both, c.get("migrate_stream_s", 0.0)),
            f"{c['stored_bytes'] / MIB:.1f} MiB", f"{b['bytes'] / MIB:.1f} MiB",
        ))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)) for r in (head, *rows)]
    lines.append("(medians [min-max] over the repeats; x: the baseline's time over ours, higher is better: "
                 "PAUSE against dcp.async_save's blocking, DURABLE against torch.save and dcp.save)")
    lines.append("restore breakdown (medians): " + "; ".join(
        f"{c['state_mb']:g} MB x {c['ranks']}: " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f}s" for k, v in c["restore_breakdown"].items())
        for c in cases))
    return "\n".join(lines)


def _x(baseline: float, ours: float) -> str:
    return f"{baseline / ours:.1f}" if ours > 0 else "-"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rota bench checkpoint", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--json", action="store_true", help="print the cases as JSON")
    p.add_argument("--quick", action="store_true", help="a small state, one repeat (CI)")
    p.add_argument("--sizes", default=None, help="state sizes in MB, comma-separated (default 50,500,2048)")
    p.add_argument("--ranks", default="1,4", help="data-parallel ranks, comma-separated (default 1,4)")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats per case (default 5, 3 from 2 GB up: medians with their min and max)")
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_SIZE / MIB)
    p.add_argument("--dir", default=None, help="where the store and the baseline's file go (default: a temp dir)")
    p.add_argument("--fsync", action="store_true",
                   help="sync to disk on both sides (the store's fsync, os.fsync after torch.save); default: neither")
    p.add_argument("--chunk-sweep", action="store_true", help="measure chunk sizes instead (rota.bench.checkpoint_chunks)")
    p.add_argument("--gpu", action="store_true", help="a CUDA model's state instead (rota.bench.checkpoint_gpu)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    if "--gpu" in argv:
        from rota.bench.checkpoint_gpu import main as on_device

        return on_device([a for a in argv if a != "--gpu"])
    args = parse_args(argv)
    if args.chunk_sweep:
        from rota.bench.checkpoint_chunks import main as sweep

        return sweep(json_out=args.json)
    sizes = QUICK_SIZES if args.quick and not args.sizes else tuple(float(s) for s in (args.sizes or "50,500,2048").split(","))
    ranks = tuple(int(r) for r in args.ranks.split(","))
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit("--repeats: must be at least 1")
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
            repeats = 1 if args.quick else args.repeats or (3 if size >= 2048 else 5)
            asyncio.run(run_case(case, repeats, int(args.chunk_mb * MIB), base, args.fsync))
            out.append(case.to_dict())
            if not args.json:
                print(f"done: {size:g} MB x {r} ranks", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"cases": out}, indent=2))
    else:
        print(render(out))
    return 0
