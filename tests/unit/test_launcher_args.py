"""The job launcher's own argument parsing (it runs without argparse: see its docstring)."""

from __future__ import annotations

import pytest

from rota.agent.launcher import parse_args

FULL = ["--exit-file", "/x/exit", "--lease-file", "/x/lease", "--lease-timeout", "6.5"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (FULL + ["--", "python", "train.py", "--lr", "3"], ["python", "train.py", "--lr", "3"]),
        (FULL + ["sleep", "1"], ["sleep", "1"]),
        (["--lease-timeout=6.5", "--exit-file=/x/exit", "--lease-file", "/x/lease", "--", "--weird"], ["--weird"]),
    ],
    ids=["options then -- then the command", "a command right after the options", "--opt=value, any order"],
)
def test_the_options_and_the_command_are_read(argv: list[str], command: list[str]) -> None:
    args = parse_args(argv)
    assert (args.exit_file, args.lease_file, args.lease_timeout, args.command) == ("/x/exit", "/x/lease", 6.5, command)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--exit-file", "/x/exit", "--", "true"], "missing ['--lease-file', '--lease-timeout']"),
        (FULL + ["--verbose", "1", "--", "true"], "unknown ['--verbose']"),
        (FULL + ["--"], "no command"),
        (FULL[:-1] + ["soon", "--", "true"], "--lease-timeout: not a number"),
        (["--exit-file"], "--exit-file: missing value"),
        (FULL + ["--sched", "fifo", "--", "true"], "--sched: only 'idle' is known"),
    ],
    ids=["a missing option", "an unknown option", "no command", "a timeout that is not a number", "an option without its value",
         "a scheduling class other than idle"],
)
def test_bad_arguments_stop_with_the_reason(argv: list[str], reason: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert reason in str(stopped.value)


def test_a_guest_asks_for_the_idle_scheduling_class() -> None:
    assert parse_args(FULL + ["--sched", "idle", "--", "true"]).idle
    assert not parse_args(FULL + ["--", "true"]).idle


def test_the_cgroup_files_to_join_are_read() -> None:
    args = parse_args(FULL + ["--cgroup", "/cg/memory/j/cgroup.procs,/cg/cpu/j/cgroup.procs", "--", "true"])
    assert args.cgroup_procs == ["/cg/memory/j/cgroup.procs", "/cg/cpu/j/cgroup.procs"] and args.command == ["true"]
    assert parse_args(FULL + ["--", "true"]).cgroup_procs == []
