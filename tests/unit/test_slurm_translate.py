"""rota.slurm's pure parts: ids, node lists, #SBATCH directives, their job file, filename patterns."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.slurm import directives, ids, translate
from rota.slurm.directives import DirectiveError
from rota.slurm.patterns import expand
from rota.slurm.steps import StepError
from rota.slurm.steps import parse as srun_parse


def test_numbers_map_both_ways() -> None:
    assert ids.slurm_id("j-00000004d2") == "1234"
    assert ids.slurm_id("j-00000004d2_7") == "1234_7"
    assert ids.rota_id("1234") == "j-00000004d2"
    assert ids.rota_id("1234_7") == "j-00000004d2_7"
    assert ids.rota_id(ids.slurm_id("j-ffffffffff")) == "j-ffffffffff"
    with pytest.raises(ids.SlurmIdError, match="1234x"):
        ids.rota_id("1234x")
    with pytest.raises(ids.SlurmIdError, match="that large"):
        ids.rota_id(str(16**10))


def test_node_lists_compress_as_slurm_does() -> None:
    assert ids.compress_nodes(["node-1"]) == "node-1"
    assert ids.compress_nodes(["n1", "n2", "n3", "n5", "gpu07", "gpu08", "login"]) == "n[1-3,5],gpu[07-08],login"
    assert ids.compress_nodes([]) == ""


def test_directives_stop_at_the_first_command_and_the_command_line_wins() -> None:
    text = "#!/bin/bash\n#SBATCH --job-name=a -N 1\n#SBATCH --gres=gpu:2  # two\n\necho hi\n#SBATCH --time=9\n"
    options, _ = directives.parse(directives.script_directives(text))
    assert options.values == {"job-name": "a", "nodes": "1", "gres": "gpu:2"}
    command_line, rest = directives.parse(["-J", "b", "--requeue", "job.sh"])
    assert command_line.values == {"job-name": "b", "requeue": ""} and rest == ["job.sh"]


@pytest.mark.parametrize("argument", ["--mail-user=x", "-w", "--exclusive", "--qos=high"])
def test_unsupported_options_are_refused_by_name(argument: str) -> None:
    with pytest.raises(DirectiveError, match=argument.split("=")[0]):
        directives.parse([argument, "job.sh"])


def test_job_file_of_a_submitit_script(tmp_path: Path) -> None:
    options, _ = directives.parse(["--gres=gpu:2", "--account=demo", "--time=5", "--signal=USR2@90", "--wckey=submitit",
                                   "--array=0-3%2", "--dependency=afterok:1234:1235,afterany:9", "--partition=a100",
                                   "--job-name=my job", "--open-mode=append"])
    mapping = translate.job_file(options, "#!/bin/bash\necho hi\n", "x.sh", tmp_path)
    assert mapping["name"] == "my_job" and mapping["gpus"] == 2 and mapping["tenant"] == "demo"
    assert mapping["gpu_types"] == ["a100"] and mapping["duration"] == 300 and mapping["array"] == "0-3%2"
    assert mapping["depends_on"] == [{"job": "j-00000004d2", "when": "succeeded"},
                                     {"job": "j-00000004d3", "when": "succeeded"},
                                     {"job": "j-0000000009", "when": "finished"}]
    assert mapping["restart"] == "on-failure" and mapping["env"] == {}
    command = mapping["command"]
    assert command[:3] == ["python", "-m", "rota.slurm.batch"]
    assert "".join(command[command.index("--") + 1:]) == "#!/bin/bash\necho hi\n"


def test_several_nodes_are_a_gang(tmp_path: Path) -> None:
    mapping = translate.job_file(directives.Options({"nodes": "2", "gres": "gpu:4"}), "#!/bin/sh\n", "x.sh", tmp_path)
    assert (mapping["nodes"], mapping["gpus_per_node"]) == (2, 4) and "gpus" not in mapping


def test_a_long_script_travels_in_chunks(tmp_path: Path) -> None:
    text = "#!/bin/bash\n" + "echo 0123456789\n" * 2000
    command = translate.job_file(directives.Options(), text, "x.sh", tmp_path)["command"]
    chunks = command[command.index("--") + 1:]
    assert len(chunks) > 1 and all(len(c) <= translate.CHUNK for c in chunks) and "".join(chunks) == text


@pytest.mark.parametrize(("values", "field"), [
    ({"nodes": "0"}, "--nodes"), ({"gres": "mps:1"}, "--gres"), ({"time": "1:2:3:4"}, "--time"),
    ({"dependency": "afterok:1?afterok:2"}, "--dependency"), ({"dependency": "singleton"}, "--dependency"),
    ({"signal": "NOPE@10"}, "--signal"), ({"export": "ALL"}, "--export"), ({"open-mode": "x"}, "--open-mode"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_option(values: dict[str, str], field: str, tmp_path: Path) -> None:
    with pytest.raises(DirectiveError, match=field):
        translate.job_file(directives.Options(values), "#!/bin/sh\n", "x.sh", tmp_path)


def test_limits_wait_for_the_job_limits_fields(tmp_path: Path) -> None:
    options = directives.Options({"mem": "4G", "cpus-per-task": "2", "ntasks-per-node": "3", "time": "1:30"})
    if translate.limits_supported():
        mapping = translate.job_file(options, "#!/bin/sh\n", "x.sh", tmp_path)
        assert mapping["memory"] == "4Gi" and mapping["cpus"] == 6 and mapping["time_limit"] == 90
    else:
        with pytest.raises(DirectiveError, match="--cpus-per-task"):
            translate.job_file(options, "#!/bin/sh\n", "x.sh", tmp_path)
    assert translate.memory_of("4096") == "4096Mi" and translate.memory_of("4G") == "4Gi"


def test_times_and_signals() -> None:
    assert [translate.seconds_of_time(t) for t in ("5", "5:30", "1:00:00", "1-0", "1-2:3", "1-2:3:4")] == [
        300, 330, 3600, 86400, 93780, 93784]
    assert translate.seconds_of_time("UNLIMITED") is None
    assert translate.signal_of("USR2@90") == ("USR2", 90, False)
    assert translate.signal_of("B:SIGTERM") == ("TERM", translate.DEFAULT_SIGNAL_LEAD_S, True)


def test_filename_patterns() -> None:
    env = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_NAME": "x",
           "SLURMD_NODENAME": "n1"}
    assert expand("%x-%j-%A_%a-%N-%t-%%-%5j.out", env, task=1) == "x-12-10_3-n1-1-%-00012.out"
    assert expand("%j_%t.out", {"SLURM_JOB_ID": "7"}) == "7_%t.out"


def test_srun_options() -> None:
    options, command = srun_parse(["--unbuffered", "--output", "o-%t", "-n2", "python", "-u", "x.py"])
    assert options == {"unbuffered": "", "output": "o-%t", "ntasks": "2"} and command == ["python", "-u", "x.py"]
    with pytest.raises(StepError, match="--pty"):
        srun_parse(["--pty", "bash"])
