"""Pure parts of `rota bench slurm`: the local Slurm's configuration, the batch script both
systems run, and the parsers of what Slurm's commands and the script print.

No I/O here: `rota.bench.slurm_local` writes and starts what these functions describe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class SlurmLayout:
    """Where one local Slurm keeps everything: all of it under `state`, removed afterwards."""

    state: Path
    host: str  # the node's name: this machine's short host name (slurmd finds itself by it)
    cpus: int  # job slots: one job holds one CPU (Rota's arm: a node of as many GPU slots)
    ctld_port: int
    d_port: int

    @property
    def conf(self) -> Path:
        return self.state / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state / "munge" / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.state / "munge" / "munge.key"


def slurm_conf(layout: SlurmLayout) -> str:
    """A one-node slurm.conf: slurmctld and slurmd on 127.0.0.1, no GPUs (`cpus` CPU slots,
    declared even where the machine has fewer cores: `config_overrides`), no accounting,
    Slurm's default scheduler settings (`sched/backfill`, no `defer`)."""
    if layout.cpus < 1:
        raise ValueError("cpus: at least 1")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", layout.host):
        raise ValueError(f"host: {layout.host!r} is not a node name Slurm accepts")
    s = layout.state
    lines = [
        "ClusterName=rotabench",
        f"SlurmctldHost={layout.host}(127.0.0.1)",
        f"SlurmctldPort={layout.ctld_port}",
        f"SlurmdPort={layout.d_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "CredType=cred/munge",
        f"StateSaveLocation={s / 'ctld'}",
        f"SlurmdSpoolDir={s / 'slurmd'}",
        f"SlurmctldPidFile={s / 'slurmctld.pid'}",
        f"SlurmdPidFile={s / 'slurmd.pid'}",
        f"SlurmctldLogFile={s / 'slurmctld.log'}",
        f"SlurmdLogFile={s / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        f"NodeName={layout.host} NodeAddr=127.0.0.1 CPUs={layout.cpus} State=UNKNOWN",
        "PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def batch_script(marks: Path, seconds: float) -> str:
    """The batch script both systems run: it appends `START_TIME SHELL_PID SLEEP_PID` to
    MARKS/KEY.start when it starts (once per start: a requeued job appends again), sleeps,
    and writes MARKS/KEY.end. KEY is the job's number, `_` and its array index (or `x`)."""
    if seconds < 0:
        raise ValueError("seconds: not negative")
    return (
        "#!/bin/bash\n"
        "#SBATCH --job-name=rotabench\n"
        f"#SBATCH --output={marks}/out-%j.txt\n"
        'key="${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_${SLURM_ARRAY_TASK_ID:-x}"\n'
        f"sleep {seconds:g} &\n"
        f'echo "$(date +%s.%N) $$ $!" >> "{marks}/$key.start"\n'
        "wait\n"
        f'date +%s.%N > "{marks}/$key.end"\n'
    )


def mark_key(number: str, index: int | None = None) -> str:
    return f"{number}_{'x' if index is None else index}"


@dataclass(frozen=True)
class Start:
    at: float  # the script's own clock (time.time() of this machine)
    pids: tuple[int, ...]  # the batch shell's and its sleep's


def parse_starts(text: str) -> list[Start]:
    """The lines of a KEY.start file, in order; a torn last line (being written) is left out."""
    starts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts[1:]):
            try:
                starts.append(Start(at=float(parts[0]), pids=(int(parts[1]), int(parts[2]))))
            except ValueError:
                continue
    return starts


def parse_end(text: str) -> float | None:
    """A KEY.end file's time; None while it is empty or half written."""
    try:
        return float(text.strip())
    except ValueError:
        return None


_SUBMITTED = re.compile(r"(?:Submitted batch job )?(\d+)(?:;\S+)?")


def parse_submitted(stdout: str) -> str:
    """The job number from `sbatch` (`Submitted batch job N`) or `sbatch --parsable` (`N` or `N;cluster`)."""
    match = _SUBMITTED.fullmatch(stdout.strip())
    if match is None:
        raise ValueError(f"sbatch printed no job number: {stdout.strip()[:200]!r}")
    return match.group(1)


def parse_node_states(sinfo: str) -> list[str]:
    """`sinfo -h -o %T` -> the node states, lower case (`idle`, `mixed`, `down*`...)."""
    return [line.strip().lower() for line in sinfo.splitlines() if line.strip()]


def parse_begin_time(squeue: str) -> float | None:
    """`squeue -h -j N -o %S` -> the job's (expected) start as seconds since the epoch, local
    time as squeue prints it; None for N/A, Unknown or nothing."""
    text = squeue.strip()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
