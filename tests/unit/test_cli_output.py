"""The CLI as a user meets it, without a cluster: `rota job`'s exit code and UTC history
times, the demo's WHY column, a closed stdout pipe, `rota sim --help`, a YAML error in
one line, and `rota jobs --watch`'s refresh loop."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from rota.cli import commands
from rota.cli.main import BROKEN_PIPE_EXIT
from rota.cli.main import main as rota_main
from rota.cli.output import ELLIPSIS, LiveScreen, shorten, ticks
from rota.client import InvalidArgumentError, Job, JobArray, load_job_file
from rota.operator import commands as operator_commands
from rota.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def _ts(at: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(at)
    return ts


def make_job(state: str = "CANCELLED", *, started: bool = True, exit_code: int = 0, reason: str = "cancelled by user",
             job_id: str = "j-1") -> Job:
    proto = common_pb2.Job(
        id=job_id, state=common_pb2.JobState.Value(f"JOB_STATE_{state}"), exit_code=exit_code, reason=reason,
        spec=common_pb2.JobSpec(name="sleep", tenant="demo", gpus=1, command=["python", "sleep.py"]),
        created_at=_ts(T0),
        history=[common_pb2.StateChange(from_state=common_pb2.JOB_STATE_PENDING,
                                        to_state=common_pb2.JobState.Value(f"JOB_STATE_{state}"),
                                        reason=reason, at=_ts(T0))],
    )
    if started:
        proto.started_at.CopyFrom(_ts(T0))
    return Job._from_proto(proto)


class FakeClient:
    def __init__(self, jobs: list[Job] | None = None) -> None:
        self.jobs = jobs or []
        self.arrays: list[JobArray] = []
        self.lists: list[tuple[str, list[str], int]] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_job(self, job_id: str) -> Job:
        return self.jobs[0]

    def list_jobs(self, *, tenant: str = "", states: list[str] | None = None, limit: int = 0) -> list[Job]:
        self.lists.append((tenant, list(states or []), limit))
        return self.jobs

    def list_jobs_and_arrays(self, *, tenant: str = "", states: list[str] | None = None,
                             limit: int = 0) -> tuple[list[Job], list[JobArray]]:
        return self.list_jobs(tenant=tenant, states=states, limit=limit), self.arrays

    def explain(self, job_id: str) -> Any:
        raise commands.UnavailableError("no allocator")

    def verdicts(self, job_id: str) -> Any:
        raise commands.UnavailableError("no detector")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        rota_main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


# `rota job`: the exit code of a stopped process, times in UTC with `Z`.
def test_a_cancelled_job_shows_its_processes_exit_code_and_one_that_never_ran_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "connect", lambda args: FakeClient([make_job(exit_code=143)]))
    code, out, _ = run_cli(capsys, "job", "j-1")
    assert code == 0 and "exit code: 143" in out
    monkeypatch.setattr(commands, "connect", lambda args: FakeClient([make_job(started=False)]))
    code, out, _ = run_cli(capsys, "job", "j-1")
    assert code == 0 and "exit code: -" in out


def test_job_history_times_are_utc_with_z_in_text_json_and_the_sdk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = make_job(exit_code=143)
    assert job.history[0].at == T0 and job.history[0].at is not None and job.history[0].at.tzinfo is not None
    monkeypatch.setattr(commands, "connect", lambda args: FakeClient([job]))
    _, out, _ = run_cli(capsys, "job", "j-1")
    assert "2025-03-04T05:06:07Z  " in out
    _, out, _ = run_cli(capsys, "job", "j-1", "--json")
    data = json.loads(out)
    assert data["history"][0]["at"] == "2025-03-04T05:06:07Z"
    assert data["created_at"] == data["started_at"] == "2025-03-04T05:06:07Z" and data["finished_at"] is None


# The demo's WHY column.
@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("short", 60, "short"),
        ("planned at step 2 (in ~1m), after j-1 ends", 25, "planned at step 2" + ELLIPSIS),
        ("planned at step 2 (in ~1m), after j-1 ends", 32, "planned at step 2 (in ~1m)" + ELLIPSIS),
        ("waits: a, b, c", 12, "waits: a" + ELLIPSIS),
        ("x" * 30, 10, "x" * 7 + ELLIPSIS),  # one word longer than the room
    ],
)
def test_shorten_cuts_at_a_word_outside_brackets(text: str, width: int, expected: str) -> None:
    got = shorten(text, width)
    assert got == expected and len(got) <= width


def test_the_demo_table_never_cuts_inside_parentheses() -> None:
    reason = "planned at step 2 (in ~1m 30s, on node-1 GPUs [0, 1]) after j-0123456789 and j-9876543210 end"
    why = operator_commands.demo_table([make_job("PENDING", reason=reason)]).splitlines()[1].split("PENDING")[1]
    assert why.rstrip().endswith(ELLIPSIS) and why.count("(") == why.count(")")


# A closed stdout pipe (`rota ... | head`).
@pytest.mark.parametrize("argv", [["--help"], ["sim", "--help"], ["jobs", "--json"]])
def test_a_closed_stdout_pipe_exits_quietly(argv: list[str], tmp_path: Path) -> None:
    # `jobs --json` prints far more than a pipe holds, from a fake client, through rota.cli.running.run.
    script = textwrap.dedent("""
        import sys
        from rota.cli import commands
        from rota.cli.main import main

        class Row:
            def __init__(self, i): self.i = i
            def to_dict(self): return {"id": f"j-{self.i}", "pad": "x" * 200}

        class Fake:
            def __enter__(self): return self
            def __exit__(self, *exc): pass
            def list_jobs(self, **kw): return [Row(i) for i in range(5000)]

        commands.connect = lambda args: Fake()
        main(sys.argv[1:])
    """)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        done = subprocess.run([sys.executable, "-c", script, *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60, cwd=REPO)
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode in (0, BROKEN_PIPE_EXIT), done.stderr


# `rota sim --help` names make-trace.
def test_sim_help_lists_make_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "sim", "--help")
    assert code == 0 and "make-trace" in out and "rota sim make-trace --help" in out


# A YAML error is one line: the file, the line and column, the reason.
def test_a_yaml_error_is_one_line_naming_the_file_line_column_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: [a, b\ngpus: 1\n")
    with pytest.raises(InvalidArgumentError) as info:
        load_job_file(bad)
    assert info.value.field == "file" and "\n" not in info.value.message and not info.value.detail
    assert info.value.message.startswith(f"file: {bad}, line 3, column 5: not valid YAML: expected ',' or ']'")
    assert "(while parsing a flow sequence at line 2, column 10)" in info.value.message
    code, out, err = run_cli(capsys, "submit", str(bad))
    assert code == 1 and out == ""
    assert err.splitlines() == [f"rota: INVALID_ARGUMENT: {info.value.message}"]


# `rota jobs --watch`.
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + 0.25  # each refresh itself takes a quarter second


def test_ticks_keep_their_cadence_from_the_start() -> None:
    clock = FakeClock()
    assert list(ticks(1.0, 4, clock=clock, sleep=clock.sleep)) == [0, 1, 2, 3]
    assert clock.sleeps == [1.0, 0.75, 0.75]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_live_screen_redraws_in_place_on_a_terminal_and_appends_otherwise() -> None:
    tty, plain = Tty(), io.StringIO()
    for out in (tty, plain):
        screen = LiveScreen(out)
        screen.show("a\nb")
        screen.show("c")
        screen.show("c", only_changed=True)  # unchanged: nothing drawn
    assert tty.getvalue() == "\033[Ha\033[K\nb\033[K\n\033[J" + "\033[Hc\033[K\n\033[J"
    assert plain.getvalue() == "a\nb\n\nc\n"


def watch_args(**overrides: Any) -> argparse.Namespace:
    args = dict(tenant="demo", state=["RUNNING"], limit=5, watch=True, interval=0.5, count=3, json=False,
                endpoint=None, token=None, home=None)
    return argparse.Namespace(**{**args, **overrides})


def test_jobs_watch_redraws_the_filtered_table_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient([make_job("RUNNING", job_id="j-a"), make_job("PENDING", job_id="j-b")])
    monkeypatch.setattr(commands, "connect", lambda args: fake)
    clock, out = FakeClock(), Tty()
    assert commands._watch_jobs(watch_args(), LiveScreen(out), clock=clock, sleep=clock.sleep) == 0
    frames = out.getvalue().split("\033[H")[1:]
    assert len(frames) == 3 and clock.sleeps == [0.5, 0.25]
    assert fake.lists == [("demo", ["RUNNING"], 5)] * 3  # the filters of `rota jobs`, every refresh
    first = frames[0].replace("\033[K", "").replace("\033[J", "").splitlines()
    assert first[0].startswith("jobs at ") and first[0].endswith("Z: 2 shown, every 0.5s (Ctrl-C stops)")
    assert first[1:] == commands.jobs_table(fake.jobs).splitlines()


def test_jobs_watch_folds_an_array_into_one_row_as_rota_jobs_does(monkeypatch: pytest.MonkeyPatch) -> None:
    task = dataclasses.replace(make_job("RUNNING", job_id="j-arr_0"), array_id="j-arr")
    fake = FakeClient([make_job("RUNNING", job_id="j-a"), task])
    fake.arrays = [JobArray(id="j-arr", tenant="demo", name="sweep", count=4, max_running=2,
                            states={"RUNNING": 1, "PENDING": 3}, created_at=T0)]
    monkeypatch.setattr(commands, "connect", lambda args: fake)
    for expand, rows in ((False, ["j-a", "j-arr"]), (True, ["j-a", "j-arr_0"])):
        clock, out = FakeClock(), io.StringIO()
        commands._watch_jobs(watch_args(count=1, expand=expand), LiveScreen(out), clock=clock, sleep=clock.sleep)
        text = out.getvalue()
        assert all(r in text for r in rows)
        assert ("running=1 pending=3" in text) is not expand


def test_jobs_watch_without_a_terminal_prints_successive_tables_and_json_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeClient([make_job("RUNNING", job_id="j-a")])
    monkeypatch.setattr(commands, "connect", lambda args: fake)
    monkeypatch.setattr(commands.time, "sleep", lambda s: None)
    code, out, _ = run_cli(capsys, "jobs", "--watch", "--interval", "0.01", "--count", "2")
    assert code == 0 and "\033" not in out and out.count("jobs at ") == 2 and out.count("j-a") == 2
    code, out, _ = run_cli(capsys, "jobs", "--watch", "--count", "2", "--json")
    assert code == 0 and [[j["id"] for j in json.loads(line)] for line in out.splitlines()] == [["j-a"], ["j-a"]]


def test_jobs_watch_stops_quietly_on_ctrl_c_and_refuses_a_bad_interval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "connect", lambda args: FakeClient())

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands.time, "sleep", interrupt)
    code, out, err = run_cli(capsys, "jobs", "--watch")
    assert (code, err) == (0, "") and out.count("jobs at ") == 1
    code, _, err = run_cli(capsys, "jobs", "--watch", "--interval", "0")
    assert code == 1 and err.startswith("rota: --interval: ")
