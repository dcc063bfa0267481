"""`rota bench detector --real`: the detectors on a real pipeline job with real faults.

Each run starts ``examples/pipeline_failslow.py`` (4 gloo stage processes, a transformer
on packed standard-library sources) with ``ROTA_ITERATIONS_FILE`` set, tails the file as
the agent would (each line stamped when it is read), and injects one fault when the job
reports iteration `at`. Every stage process runs in its own cgroup, capped at
`STAGE_SHARE` of a CPU from its start (`_Shares`), so each stage is a device of fixed speed
and the 2 cores' other work does not move one stage against another:
- ``slow``: the rank's cap drops to `STAGE_SHARE` / `factor`, which makes it `factor` times
  slower, to the run's end (or for `length` iterations);
- ``transient``: the same for `length` iterations only (fewer than the detector's k):
  it must not mark the device bad;
- ``stop``: the rank's process is killed (SIGKILL); its stage's heartbeats stop, while the
  other stages, blocked on it, keep beating;
- ``none``: nothing, for false alarms.
The recorded lines are then replayed through the normalised detector, the raw baseline and
the heartbeat monitor (`rota.bench.detector_score`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.bench.cpu_throttle import CpuThrottle

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "pipeline_failslow.py"
STAGES = 4
BEAT_S = 0.5  # each stage's heartbeat interval (the monitor's timeout is three of them)
STOP_WATCH_S = 4.0  # after a kill, how long the other stages' beats are recorded
# Each stage's CPU cap (ours). A quota binds inside every compute burst longer than it,
# whatever the stage's average use: at half a CPU over a 3 ms period a stage runs 1.5 ms,
# waits 1.5 ms, and a burst of 15 ms CPU (one micro-batch's forward or backward at width
# 128, 512 tokens) spans ten periods, so its busy time is its CPU time × 2 within a
# period's rounding. A faulty stage at 0.5 / factor has the same rounding, so its busy
# time really is `factor` times its peers'. With 4 µ-batches of 256 tokens at width 32
# (bursts of ~3 ms, two to three quotas) the rounding made a "1.2x" stage 1.47-1.6x
# slower and the log ratios' σ 0.2-0.3. Four stages at 0.5 fill the 2 cores.
STAGE_SHARE = 0.5
SHARE_PERIOD_US = 3_000  # 0.5 / 1.5 of it (1 ms) is the kernel's floor
JOB_ARGS = ("--width", "128", "--heads", "4", "--tokens", "512", "--microbatches", "2")


@dataclass(frozen=True)
class RealFault:
    kind: str  # none, slow, transient, stop
    rank: int = 0
    at: int = 0  # the iteration the fault is injected at (once the job reports it)
    factor: float = 1.0
    length: int = 0  # transient: iterations it lasts


@dataclass
class Recording:
    lines: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (read time, line)
    start: int | None = None  # first iteration under the fault
    end: int | None = None  # first iteration after it (transient)
    end_s: float = 0.0
    quotas: list[tuple[int, float]] = field(default_factory=list)  # (iteration, the rank's cap in CPUs) as set
    more: list[Recording] = field(default_factory=list)  # the windows of a run's further faults
    load: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average when the job started and ended


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Tail:
    """New complete lines of a file, as they are appended."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


@dataclass
class _Shares:
    """Every stage process in its own cgroup, each held to `share` of one CPU.

    Four stages on 2 cores with no quota share whatever the cores have free: a quota on one
    stage then hands its CPU to the others (the job got faster) and the other sessions'
    load moves every stage's speed. With each stage capped (a cap binds inside every compute
    burst longer than its quota), every stage computes at its cap whatever else runs, like a
    device of fixed speed, and a faulty stage capped at share / factor is `factor` times
    slower than its peers."""

    pid_dir: Path
    name: str
    share: float
    throttles: dict[int, CpuThrottle] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)  # rank -> the process now in its cgroup

    def ensure(self) -> None:
        """Caps the stages whose pids have appeared (each writes its own first thing). A
        restarted job's new process for a rank joins that rank's cgroup under the cap it
        has now: a slow device stays slow across a restart."""
        for rank in range(STAGES):
            try:
                pid = int((self.pid_dir / f"rank{rank}.pid").read_text())
            except (OSError, ValueError):  # not written yet
                continue
            if self.pids.get(rank) == pid:
                continue
            throttle = self.throttles.get(rank)
            if throttle is None:
                throttle = self.throttles[rank] = CpuThrottle.create(f"{self.name}-stage{rank}", SHARE_PERIOD_US)
                throttle.limit(self.share)
            try:
                throttle.add(pid)
            except OSError:  # it exited meanwhile (a restart's old process): its successor comes
                continue
            self.pids[rank] = pid

    def slow(self, rank: int, factor: float) -> float:
        """Caps `rank` at share / factor (1: back to its share); the fraction set."""
        fraction = self.share / factor
        self.throttles[rank].limit(fraction)
        return fraction

    def close(self) -> None:
        for throttle in self.throttles.values():
            throttle.close()


@dataclass
class _Injector:
    """Applies one fault as the iterations arrive, through the stages' caps (`_Shares`)."""

    fault: RealFault
    pid_dir: Path
    shares: _Shares
    rec: Recording
    killed_at: float | None = None

    def on_iteration(self, iteration: int, now: float) -> None:
        f, rec = self.fault, self.rec
        if f.kind == "none" or iteration < f.at - 1:
            return
        if rec.start is None:
            rec.start = iteration + 1
            if f.kind == "stop":
                os.kill(int((self.pid_dir / f"rank{f.rank}.pid").read_text()), signal.SIGKILL)
                self.killed_at = now
            else:
                rec.quotas.append((iteration, round(self.shares.slow(f.rank, f.factor), 4)))
        elif f.kind != "stop" and f.length > 0 and rec.end is None and iteration + 1 >= rec.start + f.length:
            rec.quotas.append((iteration, round(self.shares.slow(f.rank, 1.0), 4)))
            rec.end = iteration + 1

    def done(self, now: float) -> bool:
        return self.killed_at is not None and now - self.killed_at > STOP_WATCH_S


@dataclass
class _Injectors:
    """Several faults in one run, in turn (each its own window), over one set of caps."""

    each: list[_Injector]
    shares: _Shares

    @property
    def rec(self) -> Recording:
        return self.each[0].rec

    def on_iteration(self, iteration: int, now: float) -> None:
        for inject in self.each:
            inject.on_iteration(iteration, now)

    def done(self, now: float) -> bool:
        return any(inject.done(now) for inject in self.each)

    def close(self) -> None:
        self.shares.close()


def _follow(proc: subprocess.Popen[bytes], tail: _Tail, inject: _Injectors,
            on_line: Callable[[float, dict[str, Any]], None] | None, deadline: float) -> None:
    """Reads the job's lines as they come, injecting the fault, until the job ends (or a
    killed stage's silence has been watched long enough)."""
    while True:
        now = time.monotonic()
        inject.shares.ensure()
        for line in tail.read():
            inject.rec.lines.append((now, line))
            if on_line is not None:
                on_line(now, line)
            if "iteration" in line:
                inject.on_iteration(int(line["iteration"]), now)
        if proc.poll() is not None or inject.done(now):
            inject.rec.end_s = now
            return
        if now > deadline:
            raise TimeoutError("the job ran past its time limit")
        time.sleep(0.02)


def run_job(fault: RealFault, *, seed: int, iterations: int, share: float = STAGE_SHARE,
            layers: str = "2,2,2,2", timeout_s: float = 1500, job_args: tuple[str, ...] = JOB_ARGS,
            on_line: Callable[[float, dict[str, Any]], None] | None = None,
            on_start: Callable[[Path], None] | None = None, also: tuple[RealFault, ...] = ()) -> Recording:
    """One real run of the job under `fault` (and then `also`, each in its own window:
    `Recording.more`); every cgroup made is removed, every process ended."""
    rec = Recording()
    with tempfile.TemporaryDirectory(prefix="rota-failslow-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "ROTA_ITERATIONS_FILE": str(work / "iterations.jsonl"), "PYTHONUNBUFFERED": "1"}
        env.pop("ROTA_LAYOUT", None)
        argv = [sys.executable, str(JOB), "--iterations", str(iterations), "--seed", str(seed),
                "--port", str(_free_port()), "--beat", str(BEAT_S), "--pid-dir", str(work),
                "--layers-per-stage", layers, "--linger", str(STOP_WATCH_S + 30), *job_args]
        log = (work / "job.log").open("wb")
        rec.load = (os.getloadavg()[0], 0.0)
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if on_start is not None:
            on_start(work)  # where the stages write their pids
        name = f"{os.getpid()}-{seed}-{layers.replace(',', '')}"
        more = [Recording() for _ in also]
        rec.more = more
        shares = _Shares(work, name, share)
        inject = _Injectors([_Injector(f, work, shares, r) for f, r in zip((fault, *also), (rec, *more), strict=True)], shares)
        try:
            _follow(proc, _Tail(work / "iterations.jsonl"), inject, on_line, time.monotonic() + timeout_s)
            if proc.returncode not in (None, 0) and fault.kind != "stop":
                raise RuntimeError(f"the job failed ({proc.returncode}): {(work / 'job.log').read_text()[-2000:]}")
        finally:
            inject.close()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()
            rec.load = (rec.load[0], os.getloadavg()[0])
    return rec


def busy_ratio(rec: Recording, rank: int, first: int, last: int) -> float:
    """The rank's busy time relative to its peers' mean, median over iterations [first, last)."""
    out = []
    for _, line in rec.lines:
        it = line.get("iteration")
        if it is not None and first <= it < last:
            times = line["rank_seconds"]
            others = [t for r, t in enumerate(times) if r != rank]
            out.append(times[rank] / statistics.mean(others))
    return statistics.median(out) if out else float("nan")


def achieved(rec: Recording, rank: int, before: int = 20, settle: int = 0) -> float | None:
    """The slowdown the fault really gave: the rank's busy time over its peers' while under
    it (from `settle` iterations after its start), against the same over the `before`
    iterations before it (None: no fault window)."""
    if rec.start is None:
        return None
    seen = max((int(line["iteration"]) for _, line in rec.lines if "iteration" in line), default=0) + 1
    end = rec.end if rec.end is not None else seen
    base = busy_ratio(rec, rank, max(0, rec.start - before), rec.start)
    first = rec.start + max(1, settle) if settle < end - rec.start else rec.start + 1
    return busy_ratio(rec, rank, first, end) / base if end > first and base > 0 else None
