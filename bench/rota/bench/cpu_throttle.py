"""Slow a process down for real: a cgroup CPU quota for the fail-slow benchmark.

A throttled process may run `fraction` of one CPU per `period_us` (cgroup v2 ``cpu.max``
"quota period", v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). A short period (4 ms)
makes the quota bite inside each compute burst of a pipeline stage, so its busy time
stretches by about 1 / fraction (less when the 2 cores' contention already holds it
below one CPU: `rota.bench.detector_real` calibrates the fraction against the measured
slowdown). Each throttle makes its own cgroup (``rota-bench-<name>``) and, on close, moves
its processes back to where they were and removes it, also when the process already died.
Job limits are the agent's own cgroup module (rota.agent); this is only the benchmark's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PERIOD_US = 4_000
V2 = "v2"
V1 = "v1"
ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_CPU = Path("/sys/fs/cgroup/cpu")


def find_backend(v2_roots: tuple[Path, ...] = ROOTS, v1_cpu: Path = V1_CPU) -> tuple[str, Path] | None:
    """(kind, root) of a writable CPU controller: cgroup v2 where its cpu controller is
    available at a root, else v1's cpu hierarchy; None when neither is (not root, no cgroups)."""
    for root in v2_roots:
        controllers = root / "cgroup.controllers"
        if controllers.is_file() and "cpu" in controllers.read_text().split():
            return V2, root
    if (v1_cpu / "cpu.cfs_quota_us").is_file():
        return V1, v1_cpu
    return None


MIN_QUOTA_US = 1_000  # the kernel's floor


def period_for(fraction: float, period_us: int = PERIOD_US) -> int:
    """The period to use for `fraction`: `period_us`, lengthened (in whole ms) where the
    quota would fall under the kernel's 1 ms floor."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1] (got {fraction})")
    return max(period_us, -(-round(MIN_QUOTA_US / fraction) // 1000) * 1000)


def quota_us(fraction: float, period_us: int = PERIOD_US) -> int:
    """The quota for `fraction` of one CPU (the kernel takes at least 1 ms)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1] (got {fraction})")
    return max(MIN_QUOTA_US, round(fraction * period_us))


@dataclass(frozen=True)
class CpuUse:
    """A process's main thread's scheduler counters (/proc/PID/schedstat: the thread that
    runs a stage's compute): ns on a CPU and ns runnable but waiting for one."""

    run_ns: int
    wait_ns: int

    @classmethod
    def read(cls, pid: int) -> CpuUse:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
        return cls(int(fields[0]), int(fields[1]))

    def rate_since(self, before: CpuUse, wall_ns: int) -> float:
        """CPUs used on average over `wall_ns` of wall time since `before`."""
        return (self.run_ns - before.run_ns) / wall_ns if wall_ns > 0 else 0.0



def limit_files(kind: str, fraction: float | None, period_us: int = PERIOD_US) -> list[tuple[str, str]]:
    """(file, content) to write, in order, for a limit (None: unlimited)."""
    if kind == V2:
        return [("cpu.max", f"{'max' if fraction is None else quota_us(fraction, period_us)} {period_us}")]
    quota = -1 if fraction is None else quota_us(fraction, period_us)
    return [("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", str(quota))]


def _home_cgroup(pid: int, kind: str) -> str:
    """The pid's cgroup path (relative to the controller's root) before we moved it."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",")
        if (kind == V2 and controllers == "") or (kind == V1 and "cpu" in names):
            return path
    return "/"


@dataclass
class CpuThrottle:
    """One cgroup holding one process; `limit(fraction)` / `limit(None)`; `close()` removes it."""

    name: str
    kind: str
    root: Path
    period_us: int = PERIOD_US
    moved: dict[int, str] = field(default_factory=dict)  # pid -> its cgroup before

    @classmethod
    def create(cls, name: str, period_us: int = PERIOD_US) -> CpuThrottle:
        found = find_backend()
        if found is None:
            raise RuntimeError("no writable cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us); run as root")
        throttle = cls(f"rota-bench-{name}", found[0], found[1], period_us)
        throttle.path.mkdir(exist_ok=True)
        return throttle

    @property
    def path(self) -> Path:
        return self.root / self.name

    def add(self, pid: int) -> None:
        """Moves the process (all its threads) into the cgroup."""
        self.moved[pid] = _home_cgroup(pid, self.kind)
        (self.path / "cgroup.procs").write_text(str(pid))

    def limit(self, fraction: float | None) -> None:
        period = self.period_us if fraction is None else period_for(fraction, self.period_us)
        for name, content in limit_files(self.kind, fraction, period):
            (self.path / name).write_text(content)

    def throttled_ns(self) -> int:
        """How long the quota has held the cgroup back (cpu.stat), ns."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["throttled_time"]) if "throttled_time" in stat else int(stat.get("throttled_usec", 0)) * 1000

    def close(self) -> None:
        """Lifts the limit, moves every process left back home, and removes the cgroup."""
        if not self.path.exists():
            return
        try:
            self.limit(None)
        except OSError:
            pass
        for pid in (self.path / "cgroup.procs").read_text().split():
            home = self.root / self.moved.get(int(pid), "/").lstrip("/")
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError:  # it exited meanwhile, or its home is gone: the root takes it
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
        os.rmdir(self.path)

    def __enter__(self) -> CpuThrottle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
