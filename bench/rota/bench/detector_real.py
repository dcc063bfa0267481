"""`rota bench detector --real`: the detectors on a real pipeline job with real faults.

Each run starts ``examples/pipeline_failslow.py`` (4 gloo stage processes, a transformer
on packed standard-library sources) with ``ROTA_ITERATIONS_FILE`` set, tails the file as
the agent would (each line stamped when it is read), and injects one fault when the job
reports iteration `at`:
- ``slow``: the rank's process goes into a cgroup whose CPU quota makes it `factor` times
  slower (the quota set from the rank's measured CPU use and trimmed to the slowdown it
  gives: `_Injector`), to the run's end (or for `length` iterations);
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

from rota.bench.cpu_throttle import CpuThrottle, CpuUse

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "pipeline_failslow.py"
STAGES = 4
BEAT_S = 0.5  # each stage's heartbeat interval (the monitor's timeout is three of them)
STOP_WATCH_S = 4.0  # after a kill, how long the other stages' beats are recorded
SHARE_WINDOW = 10  # iterations over which the throttled rank's CPU use is measured (ours)
TRIM_EVERY = 3  # iterations between trims of a throttle's quota to the slowdown it gives (ours)
TRIM_GAIN = 0.7  # the share of the gap (in 1/quota) a trim closes (ours)
# The first quota is USE_GAIN × the rank's CPU use / factor. Its use (CPU seconds per wall
# second, ~0.03 at load 30-45) counts the time it waits on its peers, so use / factor
# alone throttled its compute bursts 46-57x for a "1.5x" transient; the trimmed quotas of
# the first runs (seeds 0-2, 1.2x) settled at 8-11 x use / factor. Ours, from those runs.
USE_GAIN = 10.0


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
    quotas: list[tuple[int, float, float]] = field(default_factory=list)  # (iteration, CPU use, quota) as set
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
class _Injector:
    """Applies one fault as the iterations arrive; `close` undoes everything it made.

    With `fraction` None a throttle's quota starts at the rank's measured CPU use (its main
    thread's scheduler counters over `SHARE_WINDOW` iterations) / factor and is trimmed
    to the slowdown it measurably gives (`_track`); a number fixes the quota instead."""

    fault: RealFault
    pid_dir: Path
    fraction: float | None
    name: str
    rec: Recording
    throttle: CpuThrottle | None = None
    killed_at: float | None = None
    uses: list[tuple[CpuUse, int, int]] = field(default_factory=list)  # per iteration: counters, quota holds, wall ns
    ratios: list[float] = field(default_factory=list)  # per iteration: the rank's busy time over its peers' mean
    baseline: float = 1.0  # that ratio before the fault
    under: int = 0  # ratios seen when the quota was last set
    first: int = 0  # ratios seen when the fault began

    def pid(self) -> int:
        return int((self.pid_dir / f"rank{self.fault.rank}.pid").read_text())

    def _use(self) -> float:
        """CPUs the rank used on average over the window (its main thread)."""
        (first, _, t0), (last, _, t1) = self.uses[0], self.uses[-1]
        return last.rate_since(first, t1 - t0)

    def _track(self, iteration: int, line: dict[str, Any]) -> None:
        """Reads the rank's counters and its busy time over its peers'; while throttled,
        sets the quota: first to USE_GAIN × the rank's measured CPU use over the window / factor, then
        trimmed to the slowdown it measurably gives (the median of its last 2·TRIM_EVERY
        ratios under the fault over the one before; in 1/q, by TRIM_GAIN of the gap to the
        factor, every TRIM_EVERY iterations)."""
        times = line.get("rank_seconds") or []
        r = self.fault.rank
        if len(times) > r and all(t is not None for t in times):
            others = [t for i, t in enumerate(times) if i != r]
            self.ratios.append(times[r] / statistics.mean(others) if statistics.mean(others) > 0 else 1.0)
        try:
            held = self.throttle.throttled_ns() if self.throttle is not None else 0
            self.uses = [*self.uses, (CpuUse.read(self.pid()), held, time.monotonic_ns())][-SHARE_WINDOW - 1:]
        except (OSError, ValueError):  # not started yet, or gone
            return
        if self.throttle is None or self.rec.end is not None or len(self.uses) < 2 or self.fraction is not None:
            return
        if not self.rec.quotas:
            self.baseline = statistics.median(self.ratios[-20:]) if self.ratios else 1.0
            self.under = self.first = len(self.ratios)
            q = min(1.0, max(0.02, USE_GAIN * self._use() / self.fault.factor))
        else:
            if len(self.ratios) - self.under < TRIM_EVERY:
                return
            got = statistics.median(self.ratios[max(self.first, len(self.ratios) - 2 * TRIM_EVERY):]) / self.baseline
            q = 1 / min(50.0, max(1.0, 1 / self.rec.quotas[-1][2] + TRIM_GAIN * (self.fault.factor - got)))
            self.under = len(self.ratios)
        self.throttle.limit(q)
        self.rec.quotas.append((iteration, round(self._use(), 4), round(q, 4)))

    def on_iteration(self, iteration: int, now: float, line: dict[str, Any] | None = None) -> None:
        f, rec = self.fault, self.rec
        if f.kind in ("slow", "transient"):
            self._track(iteration, line or {})
        if f.kind == "none" or iteration < f.at - 1:
            return
        if rec.start is None:
            rec.start = iteration + 1
            if f.kind == "stop":
                os.kill(self.pid(), signal.SIGKILL)
                self.killed_at = now
            elif self.fraction is not None:
                self.throttle = CpuThrottle.create(self.name)
                self.throttle.add(self.pid())
                self.throttle.limit(self.fraction)
            else:
                self.throttle = CpuThrottle.create(self.name)
                self.throttle.add(self.pid())
                self.uses = [(u, 0, t) for u, _, t in self.uses]
                self._track(iteration, {})
        elif f.kind != "stop" and f.length > 0 and rec.end is None and iteration + 1 >= rec.start + f.length:
            assert self.throttle is not None
            self.throttle.limit(None)
            rec.end = iteration + 1

    def done(self, now: float) -> bool:
        return self.killed_at is not None and now - self.killed_at > STOP_WATCH_S

    def close(self) -> None:
        if self.throttle is not None:
            self.throttle.close()


@dataclass
class _Injectors:
    """Several faults in one run, in turn (each its own window and cgroup)."""

    each: list[_Injector]

    @property
    def rec(self) -> Recording:
        return self.each[0].rec

    def on_iteration(self, iteration: int, now: float, line: dict[str, Any]) -> None:
        for inject in self.each:
            inject.on_iteration(iteration, now, line)

    def done(self, now: float) -> bool:
        return any(inject.done(now) for inject in self.each)

    def close(self) -> None:
        for inject in self.each:
            inject.close()


def _follow(proc: subprocess.Popen[bytes], tail: _Tail, inject: _Injector | _Injectors,
            on_line: Callable[[float, dict[str, Any]], None] | None, deadline: float) -> None:
    """Reads the job's lines as they come, injecting the fault, until the job ends (or a
    killed stage's silence has been watched long enough)."""
    while True:
        now = time.monotonic()
        for line in tail.read():
            inject.rec.lines.append((now, line))
            if on_line is not None:
                on_line(now, line)
            if "iteration" in line:
                inject.on_iteration(int(line["iteration"]), now, line)
        if proc.poll() is not None or inject.done(now):
            inject.rec.end_s = now
            return
        if now > deadline:
            raise TimeoutError("the job ran past its time limit")
        time.sleep(0.02)


def run_job(fault: RealFault, *, seed: int, iterations: int, fraction: float | None = None,
            layers: str = "2,2,2,2", timeout_s: float = 1500,
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
                "--layers-per-stage", layers, "--linger", str(STOP_WATCH_S + 30)]
        log = (work / "job.log").open("wb")
        rec.load = (os.getloadavg()[0], 0.0)
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if on_start is not None:
            on_start(work)  # where the stages write their pids
        name = f"{os.getpid()}-{seed}-{layers.replace(',', '')}"
        more = [Recording() for _ in also]
        rec.more = more
        inject = _Injectors([_Injector(f, work, fraction, f"{name}-{i}-{f.kind}", r)
                             for i, (f, r) in enumerate(zip((fault, *also), (rec, *more), strict=True))])
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
