"""Each job's own cgroup on the node: its memory, CPU and process-count limits, and whether
the kernel killed it for memory.

One cgroup per launch (a job on one node, a gang's rank group, a realtime app's replica
set): `<hierarchy>/rota/<agent>/<job>-<epoch>`, `<agent>` the node's name and a digest of
the agent's state folder (several local clusters on one machine each have a `node-1`, and an
agent sweeps only its own). cgroup v2 where a cgroup2 hierarchy is
mounted with the memory, cpu and pids controllers; v1 otherwise, one folder per
controller's hierarchy. The job's launcher writes its own pid into each folder's
`cgroup.procs` before it starts the job (rota.agent.launcher `--cgroup`), so every process
of the job is inside from its first instruction.

Where no cgroup can be made (not root, no hierarchy, ROTA_AGENT_CGROUPS=off) `detect`
answers why, the agent logs it at start, and a job with `cpus` or `memory` is refused with
that reason rather than run without its limits (rota.agent.processes).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rota.core.quantities import format_bytes

CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000  # the kernel's default CFS period; a job's quota is cpus x this
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses a quota under 1 ms
DEFAULT_PIDS_MAX = 4096  # processes and threads per job: a fork bomb stays in its job
REMOVE_WAIT_S = 2.0  # a killed job's processes leave its cgroup within this


@dataclass(frozen=True)
class Limits:
    """What one launch may use (0 / None: no limit of that kind)."""

    memory_bytes: int = 0
    cpus: float | None = None
    pids_max: int = DEFAULT_PIDS_MAX

    @property
    def needs_cgroup(self) -> bool:
        """A limit the job asked for (pids.max is the node's own guard, not the job's)."""
        return self.memory_bytes > 0 or self.cpus is not None


@dataclass(frozen=True)
class Hierarchy:
    """Where the cgroups live: v2's one folder, or v1's folder per controller."""

    version: int
    roots: dict[str, Path]  # controller -> mount point (v2: every controller -> the one mount)

    def describe(self) -> str:
        where = sorted({str(p) for p in self.roots.values()})
        return f"cgroup v{self.version} ({', '.join(sorted(self.roots))}) at {', '.join(where)}"


def mounts(mountinfo: str) -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup2 mount, {v1 controller: its mount}) of /proc/self/mountinfo's text (pure)."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4])
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in CONTROLLERS:
                    v1.setdefault(option, Path(fields[4]))
    return v2, v1


def choose(v2: Path | None, v2_controllers: Iterable[str], v1: dict[str, Path]) -> Hierarchy | str:
    """v2 when its mount offers every controller, else v1 when every one is mounted, else why
    neither will do (pure)."""
    offered = set(v2_controllers)
    if v2 is not None and offered >= set(CONTROLLERS):
        return Hierarchy(2, {c: v2 for c in CONTROLLERS})
    if set(v1) >= set(CONTROLLERS):
        return Hierarchy(1, {c: v1[c] for c in CONTROLLERS})
    missing = sorted(set(CONTROLLERS) - set(v1))
    v2_says = f"cgroup2 at {v2} offers {', '.join(sorted(offered)) or 'no controller'}" if v2 else "no cgroup2 mount"
    return f"no cgroup hierarchy with {', '.join(CONTROLLERS)} ({v2_says}; v1 lacks {', '.join(missing)})"


def limit_files(version: int, limits: Limits) -> list[tuple[str, str, str]]:
    """(controller, file, value) to write, in order (pure). v1's memsw (memory plus swap) is
    set to the same figure so swap is no way around the limit; v2 turns swap off."""
    writes: list[tuple[str, str, str]] = []
    if limits.memory_bytes:
        if version == 2:
            writes += [("memory", "memory.max", str(limits.memory_bytes)), ("memory", "memory.swap.max", "0")]
        else:
            writes += [("memory", "memory.limit_in_bytes", str(limits.memory_bytes)),
                       ("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))]
    if limits.cpus is not None:
        quota = max(MIN_CPU_QUOTA_US, round(limits.cpus * CPU_PERIOD_US))
        if version == 2:
            writes.append(("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}"))
        else:
            writes += [("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu", "cpu.cfs_quota_us", str(quota))]
    if limits.pids_max:
        writes.append(("pids", "pids.max", str(limits.pids_max)))
    return writes


def oom_kills(version: int, memory_files: dict[str, str]) -> int:
    """How many processes the kernel killed for memory, from the memory controller's files
    (pure): v2's memory.events `oom_kill`; v1's memory.oom_control `oom_kill` (kernel 4.13
    and later), else memory.failcnt as a sign the limit was hit."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    for line in memory_files.get(name, "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    failcnt = memory_files.get("memory.failcnt", "").strip()
    return 1 if version == 1 and failcnt.isdigit() and int(failcnt) > 0 else 0


def oom_reason(memory_bytes: int) -> str:
    """The reason a job killed for memory ends with: `out of memory (limit 4 GiB)`."""
    return f"out of memory (limit {format_bytes(memory_bytes)})"


@dataclass(frozen=True)
class JobCgroup:
    """One launch's cgroup: a folder per controller (v2: one folder, named for each)."""

    version: int
    dirs: dict[str, Path]
    memory_bytes: int = 0

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in sorted(set(self.dirs.values()))]

    def oom_killed(self) -> bool:
        folder = self.dirs.get("memory")
        if folder is None:
            return False
        files = {}
        for name in ("memory.events", "memory.oom_control", "memory.failcnt"):
            try:
                files[name] = (folder / name).read_text()
            except OSError:
                continue
        return oom_kills(self.version, files) > 0

    def remove(self) -> None:
        """Kills what is left in it (a job's stray child) and removes every folder made."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        for folder in sorted(set(self.dirs.values())):
            while folder.exists():
                _kill_members(folder)
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: its processes are still on their way out
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)

    def to_meta(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": {c: str(d) for c, d in self.dirs.items()},
                "memory_bytes": self.memory_bytes}

    @staticmethod
    def from_meta(data: dict[str, Any]) -> JobCgroup:
        """The cgroup a launch's meta.json recorded (a restarted agent adopts it)."""
        dirs = {str(c): Path(str(d)) for c, d in dict(data.get("dirs") or {}).items()}
        return JobCgroup(int(data.get("version", 1)), dirs, int(data.get("memory_bytes", 0)))


def _kill_members(folder: Path) -> None:
    try:
        pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class NodeCgroups:
    """The agent's parent cgroup (`rota/<agent>` in each hierarchy) and the jobs' below it."""

    def __init__(self, hierarchy: Hierarchy, agent: str) -> None:
        self.hierarchy = hierarchy
        self.agent = agent
        self.parents = {c: root / "rota" / agent for c, root in hierarchy.roots.items()}

    def prepare(self) -> None:
        """Makes the parents (v2: with memory and pids enabled for their children); OSError
        when this process may not."""
        for controller, parent in self.parents.items():
            parent.mkdir(parents=True, exist_ok=True)
            if controller != "cpu":
                self._enable(controller)

    def _enable(self, controller: str) -> None:
        """v2: the controller enabled from the root down to the agent's parent."""
        if self.hierarchy.version == 2:
            root = self.hierarchy.roots[controller]
            for folder in (root, root / "rota", self.parents[controller]):
                _write(folder / "cgroup.subtree_control", f"+{controller}")

    def create(self, name: str, limits: Limits) -> JobCgroup:
        """The launch's cgroup with its limits written; OSError (with what failed) otherwise,
        after removing what was made. A job joins the cpu controller only when it asks for
        `cpus`: a cpu cgroup is one scheduling entity beside every process outside it, so
        a job without a quota would otherwise get less CPU on a busy machine than it had."""
        controllers = [c for c in self.parents if c != "cpu" or limits.cpus is not None]
        if limits.cpus is not None:
            self._enable("cpu")
        dirs = {c: self.parents[c] / name for c in controllers}
        made = JobCgroup(self.hierarchy.version, dirs, limits.memory_bytes)
        try:
            for folder in sorted(set(dirs.values())):
                folder.mkdir(exist_ok=True)
            for controller, file, value in limit_files(self.hierarchy.version, limits):
                path = dirs[controller] / file
                if file == "memory.memsw.limit_in_bytes" and not path.exists():
                    continue  # no swap accounting on this kernel: no swap to escape into
                _write(path, value)
        except OSError:
            made.remove()
            raise
        return made

    def release(self) -> None:
        """Removes the node's parents when no job's cgroup is left in them (the agent
        stopping with its jobs); one still holding a running job's stays."""
        for parent in set(self.parents.values()):
            for folder in (parent, parent.parent):  # `rota/` too, once no other node's is in it
                try:
                    folder.rmdir()
                except OSError:
                    break

    def sweep(self, keep: set[str]) -> int:
        """Removes job cgroups left by a previous agent process that no adopted job owns."""
        removed = 0
        for parent in set(self.parents.values()):
            for folder in parent.iterdir() if parent.is_dir() else ():
                if folder.is_dir() and folder.name not in keep:
                    JobCgroup(self.hierarchy.version, {"any": folder}).remove()
                    removed += 1
        return removed


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def agent_name(node: str, home: str) -> str:
    """`node-1.3f9a2c1b`: the node's name and a digest of the agent's state folder."""
    return f"{node}.{hashlib.sha256(home.encode()).hexdigest()[:8]}"


def detect(agent: str, mode: str = "auto") -> NodeCgroups | str:
    """The agent's cgroups (`agent`: its folder's name, see `agent_name`), ready for jobs; or
    why there are none (the agent logs it and refuses jobs with limits). `mode` "off"
    (ROTA_AGENT_CGROUPS=off) turns them off."""
    if mode == "off":
        return "turned off (ROTA_AGENT_CGROUPS=off)"
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        return f"cannot read /proc/self/mountinfo: {exc.strerror}"
    v2, v1 = mounts(mountinfo)
    offered: list[str] = []
    if v2 is not None:
        try:
            offered = (v2 / "cgroup.controllers").read_text().split()
        except OSError:
            offered = []
    chosen = choose(v2, offered, v1)
    if isinstance(chosen, str):
        return chosen
    cgroups = NodeCgroups(chosen, agent)
    try:
        cgroups.prepare()
    except OSError as exc:
        return f"cannot make {chosen.describe()}'s rota/{agent}: {exc.strerror or exc} (the agent needs root, or a delegated cgroup)"
    return cgroups
