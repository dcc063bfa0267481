"""`rota bench slurm`'s pure parts: the local Slurm's configuration, the batch script both
systems run, and the parsers of Slurm's output and of the script's stamps."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from rota.bench.slurm import summary, table
from rota.bench.slurm_conf import (
    SlurmLayout,
    batch_script,
    mark_key,
    parse_begin_time,
    parse_end,
    parse_node_states,
    parse_starts,
    parse_submitted,
    slurm_conf,
)

LAYOUT = SlurmLayout(state=Path("/tmp/rota-slurm-x"), host="vm", cpus=4, ctld_port=16817, d_port=16818)


def _settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if not line.startswith(("NodeName", "PartitionName")))


def test_the_conf_keeps_every_path_in_the_state_folder_and_names_one_node_of_the_given_slots() -> None:
    text = slurm_conf(LAYOUT)
    settings = _settings(text)
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile",
                "SlurmdLogFile"):
        assert settings[key].startswith("/tmp/rota-slurm-x/"), key
    assert settings["AuthInfo"] == "socket=/tmp/rota-slurm-x/munge/munge.socket"
    assert settings["SlurmctldHost"] == "vm(127.0.0.1)"
    assert (settings["SlurmctldPort"], settings["SlurmdPort"]) == ("16817", "16818")
    nodes = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert nodes == ["NodeName=vm NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN"]
    assert "Gres" not in text and "accounting_storage/none" in text


@pytest.mark.parametrize("layout", [
    SlurmLayout(state=Path("/s"), host="vm", cpus=0, ctld_port=1, d_port=2),
    SlurmLayout(state=Path("/s"), host="bad host", cpus=2, ctld_port=1, d_port=2),
])
def test_the_conf_refuses_no_slots_and_a_name_slurm_would_not_take(layout: SlurmLayout) -> None:
    with pytest.raises(ValueError, match="cpus|host"):
        slurm_conf(layout)


def test_the_batch_script_stamps_its_start_and_end_under_its_key(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(batch_script(tmp_path, 0))
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "17"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)  # a requeued job starts again
    starts = parse_starts((tmp_path / f"{mark_key('17')}.start").read_text())
    assert len(starts) == 2 and starts[0].at <= starts[1].at
    assert all(len(s.pids) == 2 and s.pids[0] != s.pids[1] for s in starts)
    assert (parse_end((tmp_path / "17_x.end").read_text()) or 0) >= starts[1].at
    assert parse_end("") is None and parse_end("1796322") == 1796322.0
    array_env = {**env, "SLURM_ARRAY_JOB_ID": "16", "SLURM_ARRAY_TASK_ID": "3"}
    subprocess.run(["bash", str(script)], env=array_env, check=True, timeout=30)
    assert (tmp_path / f"{mark_key('16', 3)}.end").exists()
    assert batch_script(tmp_path, 0.5).splitlines()[0] == "#!/bin/bash"
    with pytest.raises(ValueError, match="seconds"):
        batch_script(tmp_path, -1)


def test_a_torn_or_foreign_stamp_line_is_left_out() -> None:
    text = "1796322370.82 13909 13910\n1796322371.5 13911\nnot a line\n"
    assert [(s.at, s.pids) for s in parse_starts(text)] == [(1796322370.82, (13909, 13910))]


@pytest.mark.parametrize(("stdout", "number"), [
    ("Submitted batch job 42\n", "42"), ("42\n", "42"), ("42;rotabench\n", "42"), ("7", "7"),
])
def test_sbatch_output_gives_the_job_number(stdout: str, number: str) -> None:
    assert parse_submitted(stdout) == number


@pytest.mark.parametrize("stdout", ["", "sbatch: error: Batch job submission failed", "Submitted batch job x"])
def test_sbatch_output_without_a_number_is_an_error(stdout: str) -> None:
    with pytest.raises(ValueError, match="no job number"):
        parse_submitted(stdout)


def test_sinfo_and_squeue_outputs() -> None:
    assert parse_node_states("idle\n") == ["idle"]
    assert parse_node_states("IDLE\n down* \n\n") == ["idle", "down*"]
    assert parse_begin_time("2026-12-03T18:28:22\n") == datetime(2026, 12, 3, 18, 28, 22).timestamp()
    assert parse_begin_time("N/A") is None
    assert parse_begin_time("") is None


def test_the_table_puts_both_systems_side_by_side_with_the_ratio() -> None:
    report = {"rota": {"cancel_to_gone_s": summary([0.2, 0.1, 0.3])},
              "slurm": {"cancel_to_gone_s": summary([0.4]), "requeue_to_eligible_s": summary([120.0])},
              "rota_over_slurm": {"cancel_to_gone_s": 0.5}}
    lines = table(report).splitlines()
    assert lines[0] == "| figure, s (median, min–max) | Slurm | rota | rota / Slurm |"
    assert lines[2] == "| cancel_to_gone_s | 0.400 (0.400–0.400) | 0.200 (0.100–0.300) | 0.5 |"
    assert lines[3] == "| requeue_to_eligible_s | 120.000 (120.000–120.000) | — | — |"
