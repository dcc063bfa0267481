"""The trips a newcomer met on the CLI, without a cluster: a mistyped enum flag names the
flag and its values, `rota plan`'s columns say what they hold (a GPU count, then the
indices on each node), its start column says when rather than a step number, `rota plan
--render` refuses a folder that is not there, the GPUS column counts what a job holds, and
`rota cancel` on a finished job says there was nothing to cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rota.cli import commands, flags, plan_commands
from rota.cli.array_commands import cancel_text
from rota.cli.main import main as rota_main
from rota.client import Job, JobArray
from rota.client.plan import CurrentPlan, PlannedJob
from rota.v1 import common_pb2


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        rota_main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def job(state: str = "RUNNING", *, gpus: int = 1, node: str = "", held: tuple[int, ...] = (),
        gang: tuple[str, ...] = (), replicas: dict[str, list[int]] | None = None, command: bool = True) -> Job:
    proto = common_pb2.Job(
        id="j-1", state=common_pb2.JobState.Value(f"JOB_STATE_{state}"), node=node, gpus=list(held),
        spec=common_pb2.JobSpec(name="x", tenant="demo", gpus=gpus, command=["python", "x.py"] if command else []),
    )
    proto.gang.nodes.extend(gang)
    for name, indices in (replicas or {}).items():
        proto.replicas.add(node=name, gpus=indices)
    return Job._from_proto(proto)


# A mistyped enum-valued flag: one line naming the flag and listing the values.
def test_a_mistyped_state_names_the_flag_and_lists_every_state(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "jobs", "--state", "RUNNIN", "--endpoint", "127.0.0.1:1")
    assert code == 1 and out == ""
    assert err == ("rota: --state: unknown state 'RUNNIN' (one of PENDING, SCHEDULED, RUNNING, PAUSED, "
                   "SUCCEEDED, FAILED, CANCELLED, LOST)\n")
    assert "JOB_STATE" not in err


def test_states_are_taken_in_any_case_and_every_wire_state_is_listed() -> None:
    assert flags.job_states(["running", "Pending"]) == ["RUNNING", "PENDING"]
    wire = {n.removeprefix("JOB_STATE_") for n in common_pb2.JobState.keys()} - {"UNSPECIFIED"}
    assert set(flags.JOB_STATES) == wire


def test_a_mistyped_usage_grouping_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "usage", "--by", "week", "--endpoint", "127.0.0.1:1")
    assert code == 1 and err == "rota: --by: unknown grouping 'week' (one of job, tenant, user, day, gpu)\n"


# `rota plan --render` into a folder that is not there.
def test_render_into_a_missing_folder_is_refused_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    target = tmp_path / "nowhere" / "x.png"
    code, out, err = run_cli(capsys, "plan", "--render", str(target), "--endpoint", "127.0.0.1:1")
    assert code == 1 and out == ""
    assert err == f"rota: --render: folder '{target.parent}' does not exist (create it, or pick another path)\n"
    assert not target.parent.exists()
    with pytest.raises(ValueError, match="is a folder"):
        plan_commands.check_render_path(tmp_path)
    plan_commands.check_render_path(tmp_path / "plan.png")  # an existing folder: fine


# `rota plan`'s job table.
def current_plan(jobs: list[PlannedJob], grid: list[list[str]], labels: list[str]) -> CurrentPlan:
    return CurrentPlan(epoch=3, created_at=None, policy="fast", trigger="", step_seconds=30.0,
                       horizon=len(grid[0]), gpu_labels=labels, grid=grid, jobs=jobs)


def test_plan_rows_count_gpus_and_name_their_indices_per_node() -> None:
    labels = ["node-1/0", "node-1/1", "node-2/0", "node-2/1"]
    grid = [["app", "app", ""],   # the realtime app: one replica on each node now
            ["gang", "gang", ""],
            ["app", "", "late"],
            ["gang", "gang", "late"]]
    jobs = [
        PlannedJob("app", "demo", "realtime", "node-1", [0], -1, 0.0),  # its entry names its home node only
        PlannedJob("gang", "demo", "training", "node-1", [1], 0, 60.0, ["node-1", "node-2"]),
        PlannedJob("late", "demo", "training", "", [], 2, 60.0),
        PlannedJob("masked", "demo", "training", "node-9", [2, 3], -1, 0.0),  # not in the grid shown
        PlannedJob("never", "demo", "training", "", [], -2, 0.0),
    ]
    rows = {r[0]: r[3:] for r in plan_commands.job_rows(current_plan(jobs, grid, labels))}
    assert rows["app"] == ["running", "2", "node-1 [0] node-2 [0]"]
    assert rows["gang"] == ["now", "2", "node-1 [1] node-2 [1]"]
    assert rows["late"] == ["in ~1m", "2", "node-2 [0,1]"]
    assert rows["masked"] == ["running", "2", "node-9 [2,3]"]
    assert rows["never"] == ["not planned", "-", "-"]


@pytest.mark.parametrize(("step", "seconds", "text"), [
    (-2, 30.0, "not planned"), (-1, 30.0, "running"), (0, 30.0, "now"),
    (3, 30.0, "in ~1m30s"), (2, 3600.0, "in ~2h"), (30, 3600.0, "in ~1d6h"), (1, 3.0, "in ~3s"),
])
def test_a_planned_start_is_a_time_from_now_not_a_step_number(step: int, seconds: float, text: str) -> None:
    assert plan_commands.when(step, seconds) == text


# `rota jobs`' GPUS column.
def test_the_gpus_column_counts_what_a_job_holds_else_what_it_asks() -> None:
    assert commands.gpu_count(job("PENDING", gpus=2)) == 2
    assert commands.gpu_count(job(node="node-1", held=(0, 1), gpus=2)) == 2
    assert commands.gpu_count(job(node="node-1", held=(0, 1, 2, 3), gpus=8, gang=("node-1", "node-2"))) == 8
    # A realtime app's spec asks for one GPU per replica; it holds one on each of two nodes here.
    app = job(node="node-1", held=(3,), replicas={"node-1": [3], "node-2": [0]})
    assert commands.gpu_count(app) == 2
    assert commands.gpu_count(job("PENDING", gpus=2, command=False)) == 0  # another tenant's: no spec shown
    assert " 2 " in commands.jobs_table([app]).splitlines()[1]


# `rota cancel` on what had finished.
def test_cancel_says_a_finished_job_had_nothing_to_cancel() -> None:
    assert cancel_text(job("SUCCEEDED"), already=True) == "j-1: already SUCCEEDED, nothing to cancel"
    assert cancel_text(job("CANCELLED"), already=False) == "j-1 CANCELLED"
    done = JobArray(id="a-1", tenant="demo", name="x", count=2, max_running=0, job_ids=[], created_at=None,
                    states={"SUCCEEDED": 2})
    assert cancel_text(done, already=False) == "a-1: every task had already finished, nothing to cancel (succeeded=2)"


class CancelClient:
    def __init__(self, found: Job) -> None:
        self.found = found
        self.cancelled: list[str] = []

    def __enter__(self) -> CancelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_job(self, job_id: str) -> Job:
        return self.found

    def cancel_job_or_array(self, job_id: str, *, reason: str = "") -> Any:
        self.cancelled.append(job_id)
        return job("CANCELLED")


@pytest.mark.parametrize(("state", "printed", "calls"), [
    ("SUCCEEDED", "j-1: already SUCCEEDED, nothing to cancel\n", []),
    ("FAILED", "j-1: already FAILED, nothing to cancel\n", []),
    ("RUNNING", "j-1 CANCELLED\n", ["j-1"]),
])
def test_rota_cancel_on_a_finished_job_exits_0_and_says_so(
    state: str, printed: str, calls: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    client = CancelClient(job(state))
    monkeypatch.setattr(commands, "connect", lambda args: client)
    code, out, err = run_cli(capsys, "cancel", "j-1")
    assert (code, out, err) == (0, printed, "") and client.cancelled == calls
