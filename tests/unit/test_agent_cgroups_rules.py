"""The agent's cgroup rules over plain data: which hierarchy, what is written, what counts
as an OOM kill, and the reasons a failed job ends with (pure, table-driven)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rota.agent import cgroups, declared
from rota.core.node_reports import failure_reason

MOUNTINFO_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTINFO_JOINED = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"


def test_mounts_read_v1_controllers_and_the_cgroup2_mount() -> None:
    v2, v1 = cgroups.mounts(MOUNTINFO_V1)
    assert v2 == Path("/sys/fs/cgroup/unified")
    assert v1 == {"cpu": Path("/sys/fs/cgroup/cpu"), "memory": Path("/sys/fs/cgroup/memory"),
                  "pids": Path("/sys/fs/cgroup/pids")}
    assert cgroups.mounts(MOUNTINFO_JOINED)[1] == {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct")}
    assert cgroups.mounts(MOUNTINFO_V2) == (Path("/sys/fs/cgroup"), {})


@pytest.mark.parametrize(("mountinfo", "offered", "version"), [
    (MOUNTINFO_V1, ["hugetlb"], 1),  # this machine's: an empty cgroup2 beside v1
    (MOUNTINFO_V1, ["cpu", "memory", "pids", "io"], 2),  # v2 wherever it has the controllers
    (MOUNTINFO_V2, ["cpuset", "cpu", "io", "memory", "pids"], 2),
])
def test_v2_where_it_has_the_controllers_else_v1(mountinfo: str, offered: list[str], version: int) -> None:
    v2, v1 = cgroups.mounts(mountinfo)
    chosen = cgroups.choose(v2, offered, v1)
    assert isinstance(chosen, cgroups.Hierarchy) and chosen.version == version


@pytest.mark.parametrize(("mountinfo", "offered", "says"), [
    (MOUNTINFO_V2, ["cpu", "io"], "offers cpu, io"),
    ("", [], "no cgroup2 mount"),
    (MOUNTINFO_JOINED, [], "v1 lacks memory, pids"),
])
def test_no_usable_hierarchy_says_why(mountinfo: str, offered: list[str], says: str) -> None:
    v2, v1 = cgroups.mounts(mountinfo)
    chosen = cgroups.choose(v2, offered, v1)
    assert isinstance(chosen, str) and says in chosen


def test_turned_off_says_so() -> None:
    assert cgroups.detect("n1", "off") == "turned off (ROTA_AGENT_CGROUPS=off)"


@pytest.mark.parametrize(("version", "limits", "expected"), [
    (1, cgroups.Limits(memory_bytes=4 << 30, cpus=2.0, pids_max=100), [
        ("memory", "memory.limit_in_bytes", str(4 << 30)), ("memory", "memory.memsw.limit_in_bytes", str(4 << 30)),
        ("cpu", "cpu.cfs_period_us", "100000"), ("cpu", "cpu.cfs_quota_us", "200000"), ("pids", "pids.max", "100")]),
    (2, cgroups.Limits(memory_bytes=256 << 20, cpus=0.5), [
        ("memory", "memory.max", str(256 << 20)), ("memory", "memory.swap.max", "0"),
        ("cpu", "cpu.max", "50000 100000"), ("pids", "pids.max", str(cgroups.DEFAULT_PIDS_MAX))]),
    (2, cgroups.Limits(cpus=0.001), [("cpu", "cpu.max", "1000 100000"), ("pids", "pids.max", "4096")]),
    (1, cgroups.Limits(pids_max=0), []),
])
def test_limit_files(version: int, limits: cgroups.Limits, expected: list[tuple[str, str, str]]) -> None:
    assert cgroups.limit_files(version, limits) == expected


def test_only_cpus_or_memory_need_a_cgroup() -> None:
    assert not cgroups.Limits().needs_cgroup
    assert cgroups.Limits(cpus=1.0).needs_cgroup and cgroups.Limits(memory_bytes=1).needs_cgroup


@pytest.mark.parametrize(("version", "files", "kills"), [
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"}, 2),
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "78\n"}, 1),  # older kernels
    (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "memory.failcnt": "0\n"}, 0),
    (2, {"memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n"}, 1),
    (2, {"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}, 0),
    (2, {}, 0),
])
def test_oom_kills(version: int, files: dict[str, str], kills: int) -> None:
    assert cgroups.oom_kills(version, files) == kills


@pytest.mark.parametrize(("code", "error", "reason"), [
    (137, "out of memory (limit 4 GiB)\nTraceback...", "out of memory (limit 4 GiB)"),
    (143, "time limit 0:10:00 reached", "time limit 0:10:00 reached"),
    (126, "refused: this node cannot enforce cpus or memory limits (cgroups: x)", "refused: this node cannot enforce cpus or memory limits (cgroups: x)"),
    (1, "Traceback (most recent call last):\n  out of memory (", "exit code 1"),
    (2, "", "exit code 2"),
])
def test_the_reason_a_failed_job_ends_with(code: int, error: str, reason: str) -> None:
    assert failure_reason(code, error) == reason


def test_oom_reason_formats_the_limit() -> None:
    assert cgroups.oom_reason(4 << 30) == "out of memory (limit 4 GiB)"


@pytest.mark.parametrize(("flags", "meminfo", "cpus", "memory"), [
    ({}, "MemTotal:       16384000 kB\nMemFree: 1 kB\n", 8.0, 16384000 * 1024),
    ({"cpus": 2.0, "memory": 4 << 30}, "MemTotal: 1 kB\n", 2.0, 4 << 30),
    ({}, "", 8.0, 0),  # unreadable: nothing is checked
])
def test_node_capacity_declared_or_discovered(flags: dict[str, float], meminfo: str, cpus: float, memory: int) -> None:
    args = argparse.Namespace(cpus=flags.get("cpus"), memory=flags.get("memory"))
    assert declared.capacity(args, meminfo, 8) == (cpus, memory)


@pytest.mark.parametrize(("flag", "value"), [("--cpus", "0"), ("--cpus", "many"), ("--memory", "-1Gi"), ("--memory", "4GB")])
def test_bad_capacity_flags_name_the_flag(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    declared.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, value])
    assert flag in capsys.readouterr().err
