"""`rota bench checkpoint`: pause, restore and migration of a training job's state through
Rota's checkpoint path, beside framework checkpoints of the same state (torch.save and
torch.load, torch.load(mmap=True), safetensors, pre-started and cold, dcp.async_save:
rota.bench.checkpoint_baselines), measured in the same run, arms interleaved per repeat.

    rota bench checkpoint [--json] [--quick] [--sizes 500,2048] [--ranks 1,4] [--repeats 3] [--fsync] [--cold]
        [--no-cold-loads] [--no-baselines]
    rota bench checkpoint --chunk-sweep [--json]     the measurement behind the default chunk size
    rota bench checkpoint --gpu [--sizes ..] [--json] a CUDA model's state against torch.save/load

Per case (state size: parameters plus Adam's two moments; data-parallel ranks, whose
state is replicated), with three agents' real code (process tables, checkpoint managers)
on a temporary home and a fresh chunk store. Nodes A and C keep a warm runtime
(rota.agent.warm_runtime: an interpreter with torch imported, handed the next job),
warmed at normal priority while no arm is timed; `--cold` starts every job cold instead.
Node B runs the baselines' loaders. End point of every restore and load, Rota's and the
baselines' alike: the first step done, which first reads every byte of the state on every
rank (a mapped state is not restored until its pages are read).

- pause_s: the pause request to every rank process gone (the job blocked);
- durable_s: the pause request to the image complete in the store and restorable;
- restore_s: launching the job with the image on A to its first step done (every byte
  read), and
  restore_breakdown: where it went (process start: the launch until restore() is called;
  state transfer: waiting there for the agent's image; rebuild: mapping and applying it;
  first step);
- migrate_s: the pause request on A to the first step done on C, C's job launched once
  A's ranks are gone (nothing of the target overlaps the pause) into C's warm runtime; C's
  agent streams the staged copy from A's AgentService over gRPC (rota.agent.streaming,
  loopback here) while A's agent writes it to the store;
- stored_bytes: what the first image added to an empty store (ranks deduplicated);
- baseline, dcp: see rota.bench.checkpoint_baselines. The restore and migrate ratios are
  against the best baseline of the case: the fastest loader (restore), the fastest save
  plus load of one format (migrate).

Every time is a median over the repeats; `spread` holds [min, max] of each. ROTA_MAP_POPULATE,
ROTA_RESTORE_IN_PLACE and ROTA_ZERO_COPY in the bench's environment pass on to its jobs (the
restore as it was: ROTA_MAP_POPULATE=1 ROTA_RESTORE_IN_PLACE=0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rota.agent.checkpoints import AgentCheckpoints, ImageRecord
from rota.agent.processes import LocalJob, ProcessTable
from rota.agent.streaming import StagedStreams
from rota.bench.agent_server import AgentServer
from rota.bench.checkpoint_baselines import dcp_baseline, file_baselines
from rota.bench.checkpoint_report import Case, add_breakdown, render
from rota.imagestore.chunks import DEFAULT_CHUNK_SIZE, MIB
from rota.imagestore.settings import CheckpointSettings, default_staging_root
from rota.jobfiles import control

FULL_SIZES = (500.0, 2048.0)
QUICK_SIZES = (8.0,)
# Two: the spread's two ends beside their middle. Two repeats of the four default cases took
# 477 s here (load 3-6), which leaves room under the 15 minutes a default run must take on a
# busier 2-core machine; --repeats 3 or more for a truer median where time allows.
REPEATS = 2
STEP_TIMEOUT_S = 600.0
WARM_WAIT_S = 120.0
# What the bench passes on to its jobs from its own environment: the restore's switches, so a
# run can measure the restore as it was (ROTA_MAP_POPULATE=1 ROTA_RESTORE_IN_PLACE=0).
PASSED_ENV = ("ROTA_MAP_POPULATE", "ROTA_RESTORE_IN_PLACE", "ROTA_ZERO_COPY")
END_POINT = ("every restore and load to its first step done, which first reads every byte of the state "
             "on every rank")


@dataclass
class Node:
    table: ProcessTable
    checkpoints: AgentCheckpoints


def _node(name: str, home: Path, settings: CheckpointSettings, warm: bool,
          streams: StagedStreams | None = None) -> Node:
    home.mkdir(parents=True, exist_ok=True)
    (home / "lease").touch()
    table = ProcessTable(name, home, home / "lease", 1e9)  # the bench keeps no lease: no fencing
    if warm:  # warmed at normal priority between the timed arms only (Runner.warm), as the loaders are
        table.start_warm_runtime(idle=False, refill=False)
    return Node(table, AgentCheckpoints(name, table, home, settings, streams))


class Runner:
    """Nodes A (the job, its restores; warm), B (the baselines' loaders; cold) and C (the
    migrations' target, streaming from A's AgentService; warm), on one host."""

    def __init__(self, work: Path, chunk_size: int, fsync: bool, warm: bool) -> None:
        staging = default_staging_root("bench").parent / f"bench-{os.getpid()}"
        self.staging = staging
        self.settings = CheckpointSettings(store_dir=work / "chunks", chunk_size=chunk_size, staging_root=staging,
                                           fsync=fsync)
        self.a = _node("bench-a", work / "a", self.settings, warm)
        self.b = _node("bench-b", work / "b", self.settings, False)
        # Node C: staging of its own (so no hard links from A's), streaming from A's AgentService.
        token = secrets.token_hex(16)
        self.c_staging = staging.parent / f"bench-{os.getpid()}-c"
        self.c = _node("bench-c", work / "c", replace(self.settings, staging_root=self.c_staging / "c"), warm,
                       StagedStreams(token))
        self.source = AgentServer(self.a.checkpoints, token)
        self.work = work
        self.epoch = 0
        self.launched_unix = 0.0
        self.image = ""  # the case's latest complete image: the baselines' savers start from it
        self.spent: dict[str, float] = {}  # where the bench's own run time goes (Case.phases)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the block's wall time to `spent[name]`: the run time's profile, timed or not."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - began

    def launch(self, node: Node, command: list[str], image: str = "", wait_s: float = 0.0,
               source: str = "", job_id: str = "bench") -> LocalJob:
        self.epoch += 1
        restore = node.checkpoints.restore_dir(job_id, self.epoch) if image else None
        self.launched_unix = time.time()
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        job = node.table.launch(job_id, self.epoch, [], command, str(Path.cwd()), env, True, restore)
        if restore is not None:
            node.checkpoints.start_restore(restore, image, wait_s, source)
        return job

    async def warm(self, *nodes: Node) -> None:
        """The nodes' warm runtimes (A and C if none is named) have their imports done, as
        the pre-started loaders have before they are timed; a runtime handed a job is
        replaced here, so no import runs beside a timed arm."""
        with self.phase("warm_runtime_wait"):
            for node in nodes or (self.a, self.c):
                if node.table.warm is not None:
                    await asyncio.to_thread(node.table.warm.wait_ready, WARM_WAIT_S)

    async def pause(self, node: Node, job: LocalJob) -> ImageRecord:
        record = await node.checkpoints.checkpoint(job.job_id, job.epoch, f"img-bench-{job.epoch}", True, 300, False)
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

    async def migrate(self, job: LocalJob, command: list[str]) -> float:
        """A migration from A to C: the pause; once A's ranks are gone, C's job launched into
        C's warm runtime, streaming the staged copy from A while A writes it. Its seconds to
        the first step on C."""
        await self.warm()
        started = time.perf_counter()
        record = await self.pause(self.a, job)
        moved = self.launch(self.c, command, record.image_id, wait_s=STEP_TIMEOUT_S, source=self.source.address)
        await self.first_step(moved, record.step)
        seconds = time.perf_counter() - started
        await self.written(self.a, record.image_id)
        self.c.table.stop("bench", moved.epoch, "measured", 5)
        return seconds

    @staticmethod
    async def first_step(job: LocalJob, after: int) -> int:
        return await first_step(job, after)

    @staticmethod
    async def gone(job: LocalJob) -> None:
        await wait_gone(job)

    def close(self) -> None:
        self.source.stop()
        for node in (self.a, self.b, self.c):
            node.table.stop_all("bench done", 5)
            if node.table.warm is not None:
                node.table.warm.close()
            node.checkpoints.close()
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.c_staging, ignore_errors=True)


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


async def run_case(case: Case, repeats: int, chunk_size: int, base: Path, fsync: bool, warm: bool = True,
                   baselines: bool = True, cold_loads: bool = True) -> None:
    """Rota's arms and the baselines, interleaved per repeat; the cold loaders and dcp (never
    the best baseline: they pay an interpreter's start) in the first repeat only."""
    work = Path(tempfile.mkdtemp(prefix="rota-bench-ckpt-", dir=base))
    runner = Runner(work, chunk_size, fsync, warm)
    command = [sys.executable, "-m", "rota.bench.checkpoint_job", "--state-mb", str(case.state_mb),
               "--ranks", str(case.ranks), *(["--fsync"] if fsync else [])]
    try:
        for repeat in range(repeats):
            await rota_arms(runner, case, command, repeat)
            if baselines:
                await file_baselines(runner, case, command, first=repeat == 0, cold=cold_loads and repeat == 0)
                if repeat == 0:
                    with runner.phase("dcp"):
                        await dcp_baseline(runner, case, command)
    finally:
        case.phases = {k: round(v, 2) for k, v in runner.spent.items()}
        runner.close()
        shutil.rmtree(work, ignore_errors=True)


async def rota_arms(runner: Runner, case: Case, command: list[str], repeat: int) -> None:
    """Pause and durable write, a restore on A, a migration from A to C. Each repeat's job
    draws a state of its own (seed): the same bytes again would be deduplicated by the store
    and make the durable write of later repeats cheaper than the baselines' saves."""
    first = repeat == 0
    with runner.phase("fresh_state"):  # the job's random state and Adam step, before anything is timed
        job = runner.launch(runner.a, [*command, "--seed", str(1 + 2 * repeat)])
        await first_step(job, 0)
    started = time.perf_counter()
    record = await runner.pause(runner.a, job)
    case.pause.append(record.pause_s)
    written = await runner.written(runner.a, record.image_id)
    case.durable.append(time.perf_counter() - started)
    runner.image = record.image_id
    if first:
        case.stored_bytes = written.written_bytes  # an empty store: ranks deduplicated only
    await runner.warm()
    started = time.perf_counter()
    job = runner.launch(runner.a, command, record.image_id)
    launched = runner.launched_unix
    report = await first_report(job, record.step)
    case.restore.append(time.perf_counter() - started)
    add_breakdown(case, report, launched)
    case.migrate.append(await runner.migrate(job, command))


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def fits(state_mb: float, ranks: int) -> bool:
    # Live state, its tmpfs copy and a restoring rank's second copy, per rank, plus room.
    return ranks * state_mb * MIB * 2.3 + (1 << 30) < available_bytes()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rota bench checkpoint", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--json", action="store_true", help="print the cases as JSON")
    p.add_argument("--quick", action="store_true",
                   help="an 8 MB state, one repeat, no cold loaders (CI)")
    p.add_argument("--sizes", default=None, help="state sizes in MB, comma-separated (default 500,2048)")
    p.add_argument("--ranks", default="1,4", help="data-parallel ranks, comma-separated (default 1,4)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"repeats per case (default {REPEATS}, --quick 1): medians with their min and max")
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_SIZE / MIB)
    p.add_argument("--dir", default=None, help="where the store and the baselines' files go (default: a temp dir)")
    p.add_argument("--fsync", action="store_true",
                   help="sync to disk on both sides (the store's fsync, os.fsync after each baseline's save)")
    p.add_argument("--cold", action="store_true", help="no warm runtime: Rota's jobs start cold")
    p.add_argument("--no-cold-loads", action="store_true",
                   help="skip the cold launches of the loaders (never the best baseline; --quick skips them)")
    p.add_argument("--no-baselines", action="store_true", help="Rota's arms only (to compare restore variants)")
    p.add_argument("--chunk-sweep", action="store_true", help="measure chunk sizes instead (rota.bench.checkpoint_chunks)")
    p.add_argument("--gpu", action="store_true", help="a CUDA model's state instead (rota.bench.checkpoint_gpu)")
    return p.parse_args(argv)


def cases_of(args: argparse.Namespace) -> list[Case]:
    try:
        sizes = QUICK_SIZES if args.quick and not args.sizes else tuple(
            float(s) for s in (args.sizes or ",".join(f"{x:g}" for x in FULL_SIZES)).split(","))
    except ValueError:
        raise SystemExit(f"--sizes: not a list of numbers: {args.sizes!r}") from None
    try:
        ranks = tuple(int(r) for r in args.ranks.split(","))
    except ValueError:
        raise SystemExit(f"--ranks: not a list of integers: {args.ranks!r}") from None
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit("--repeats: must be at least 1")
    if any(s <= 0 for s in sizes) or any(r < 1 for r in ranks):
        raise SystemExit("--sizes and --ranks: must be positive")
    return [Case(size, r) for size in sizes for r in ranks]


def main(argv: list[str]) -> int:
    if "--gpu" in argv:
        from rota.bench.checkpoint_gpu import main as on_device

        return on_device([a for a in argv if a != "--gpu"])
    args = parse_args(argv)
    if args.chunk_sweep:
        from rota.bench.checkpoint_chunks import main as sweep

        return sweep(json_out=args.json)
    # A stopped bench (timeout, Ctrl-C) still stops its jobs and warm runtimes (Runner.close).
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    began = time.perf_counter()
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    repeats = args.repeats or (1 if args.quick else REPEATS)
    out: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for case in cases_of(args):
        if not fits(case.state_mb, case.ranks):
            print(f"skipped {case.state_mb:g} MB x {case.ranks} ranks: needs about "
                  f"{case.ranks * case.state_mb * 2.3 / 1024:.1f} GiB of memory, "
                  f"{available_bytes() / (1 << 30):.1f} GiB available", file=sys.stderr)
            skipped.append({"state_mb": case.state_mb, "ranks": case.ranks, "reason": "memory"})
            continue
        asyncio.run(run_case(case, repeats, int(args.chunk_mb * MIB), base, args.fsync, warm=not args.cold,
                             baselines=not args.no_baselines, cold_loads=not (args.quick or args.no_cold_loads)))
        out.append(case.to_dict())
        # The case's figures as soon as it is done: a run stopped later keeps them.
        print(f"done: {case.state_mb:g} MB x {case.ranks} ranks ({time.perf_counter() - began:.0f} s): "
              f"{json.dumps(out[-1])}", file=sys.stderr, flush=True)
    wall = round(time.perf_counter() - began, 1)
    policy = {"page_cache": "warm: every file read right after it was written, on both sides", "fsync": args.fsync,
              "warm_runtime": not args.cold, "end_point": END_POINT,
              "cold_loads": not (args.quick or args.no_cold_loads or args.no_baselines),
              "restore_env": {k: os.environ[k] for k in PASSED_ENV if k in os.environ}}
    if args.json:
        print(json.dumps({"cases": out, "skipped": skipped, "wall_s": wall, "repeats": repeats,
                          "load_average": [round(x, 2) for x in os.getloadavg()], "policy": policy}, indent=2))
    else:
        print(render(out))
        print(f"wall: {wall:.0f} s; page cache: {policy['page_cache']}; fsync: {'both' if args.fsync else 'neither'}; "
              f"warm runtime: {'on (A, C)' if not args.cold else 'off'}; end point: {END_POINT}")
    return 0
