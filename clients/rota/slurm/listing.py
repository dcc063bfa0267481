"""`squeue` and `sacct`: Rota's jobs in Slurm's columns and formats."""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rota.client import Client, Job
from rota.client.errors import NotFoundError
from rota.slurm import ids, spool

# Rota's state -> Slurm's (squeue's short code second).
STATES = {
    "PENDING": ("PENDING", "PD"), "SCHEDULED": ("PENDING", "PD"), "RUNNING": ("RUNNING", "R"),
    "PAUSED": ("PREEMPTED", "PR"), "LOST": ("REQUEUED", "RQ"), "SUCCEEDED": ("COMPLETED", "CD"),
    "FAILED": ("FAILED", "F"), "CANCELLED": ("CANCELLED", "CA"),
}
ACTIVE = ("PENDING", "SCHEDULED", "RUNNING", "PAUSED", "LOST")


def slurm_state(job: Job) -> str:
    """Slurm's state; an ended run Rota is still retrying (rota.slurm.batch's `final`) shows its end."""
    ended = spool.read_final(spool.job_folder(spool.root(), job.id))
    if ended is not None and job.state != "SUCCEEDED":
        return ended[0]
    if job.state == "FAILED" and "time limit" in job.error:
        return "TIMEOUT"
    return STATES.get(str(job.state), ("UNKNOWN", "??"))[0]


def _elapsed(job: Job) -> str:
    if job.started_at is None:
        return "0:00"
    seconds = int(((job.finished_at or datetime.now(UTC)) - job.started_at).total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{seconds:02d}" if hours or days else f"{minutes}:{seconds:02d}"
    return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}" if days else clock


def _time(at: datetime | None) -> str:
    return at.astimezone().strftime("%Y-%m-%dT%H:%M:%S") if at else "Unknown"


def _nodes(job: Job) -> list[str]:
    return job.nodes or ([job.node] if job.node else [])


FIELDS: dict[str, Callable[[Job], str]] = {
    "jobid": lambda j: ids.slurm_id(j.id), "jobidraw": lambda j: ids.slurm_id(j.id),
    "jobname": lambda j: j.name, "state": slurm_state, "nodelist": lambda j: ids.compress_nodes(_nodes(j)) or "None assigned",
    "exitcode": lambda j: f"{j.exit_code}:0", "start": lambda j: _time(j.started_at), "end": lambda j: _time(j.finished_at),
    "submit": lambda j: _time(j.created_at), "elapsed": _elapsed, "account": lambda j: j.tenant,
    "partition": lambda j: ",".join(j.spec.gpu_types) or "rota", "allocnodes": lambda j: str(len(_nodes(j))),
    "nnodes": lambda j: str(max(len(_nodes(j)), 1)), "alloctres": lambda j: f"gres/gpu={len(j.gpus)}",
    "user": lambda j: j.tenant, "reason": lambda j: j.reason or "None", "restarts": lambda j: str(max(j.attempts - 1, 0)),
    "alloccpus": lambda j: "0", "priority": lambda j: str(j.priority),
}
_WIDTHS = {"jobid": 14, "jobidraw": 14, "nodelist": 15, "start": 19, "end": 19, "submit": 19}  # Rota's numbers run to 13 digits
SACCT_DEFAULT = ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]


class FormatError(ValueError):
    """A field or format letter Rota cannot show: the message names it."""


@dataclass
class Column:
    header: str
    value: Callable[[Job], str]
    width: int  # negative: right-aligned
    truncate: bool = True


def sacct_columns(spec: str) -> list[Column]:
    columns: list[Column] = []
    for item in (spec.split(",") if spec else SACCT_DEFAULT):
        name, _, width = item.partition("%")
        key = name.strip().lower()
        if key not in FIELDS:
            raise FormatError(f"--format: field {name!r} is not supported (supported: {', '.join(sorted(FIELDS))})")
        columns.append(Column(name.strip(), FIELDS[key], int(width) if width.isdigit() else max(_WIDTHS.get(key, 10), len(name))))
    return columns


def render(columns: Sequence[Column], jobs: Sequence[Job], *, header: bool, separator: str | None,
           trailing: bool = False) -> str:
    """Slurm's fixed-width table, or `|`-separated lines (--parsable2; --parsable ends each with `|`)."""
    rows = [[c.header for c in columns]] if header else []
    rows += [[c.value(j) for c in columns] for j in jobs]
    if separator is not None:
        return "\n".join(separator.join(r) + (separator if trailing else "") for r in rows)
    lines = []
    for row in rows:
        cells = []
        for column, cell in zip(columns, row, strict=True):
            width = abs(column.width)
            cell = cell[:width] if column.truncate else cell
            cells.append(cell.rjust(width) if column.width < 0 else cell.ljust(width))
        lines.append(" ".join(cells).rstrip())
    return "\n".join(lines)


def jobs_named(client: Client, numbers: Sequence[str]) -> list[Job]:
    """The jobs `-j` names: a number is a job or every task of an array; N_I one task."""
    found: list[Job] = []
    for number in numbers:
        rota_id = ids.rota_id(number)
        try:
            found.append(client.get_job(rota_id))
        except NotFoundError:
            try:
                array = client.get_array(rota_id)
            except NotFoundError:
                continue  # Slurm prints no line for an unknown id
            tasks = array.job_ids or [j.id for j in client.list_jobs(tenant=array.tenant) if j.array_id == rota_id]
            found += sorted((client.get_job(t) for t in tasks), key=lambda j: j.array_index)
    return found


def user_name() -> str:
    return getpass.getuser()


# squeue's format letters -> (header, value).
LETTERS: dict[str, tuple[str, Callable[[Job], str]]] = {
    "i": ("JOBID", FIELDS["jobid"]), "A": ("ARRAY_JOB_ID", lambda j: ids.slurm_id(j.array_id or j.id)),
    "K": ("ARRAY_TASK_ID", lambda j: str(j.array_index) if j.array_id else "N/A"),
    "j": ("NAME", FIELDS["jobname"]), "u": ("USER", FIELDS["user"]), "a": ("ACCOUNT", FIELDS["account"]),
    "P": ("PARTITION", FIELDS["partition"]), "T": ("STATE", slurm_state),
    "t": ("ST", lambda j: next((c for s, c in STATES.values() if s == slurm_state(j)), "??")),
    "M": ("TIME", _elapsed), "D": ("NODES", FIELDS["nnodes"]), "N": ("NODELIST", FIELDS["nodelist"]),
    "R": ("NODELIST(REASON)", lambda j: ids.compress_nodes(_nodes(j)) if j.state == "RUNNING" else f"({j.reason or 'None'})"),
    "r": ("REASON", FIELDS["reason"]), "b": ("TRES_PER_NODE", lambda j: f"gres:gpu:{len(j.gpus) or j.spec.gpus}"),
    "V": ("SUBMIT_TIME", FIELDS["submit"]), "S": ("START_TIME", FIELDS["start"]),
}
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
_LETTER = re.compile(r"%(\.)?(\d*)(\w)")


def squeue_columns(spec: str) -> list[Column]:
    """squeue's -o/--format: `%[.][width]letter` items; text between them is dropped."""
    columns: list[Column] = []
    for right, width, letter in _LETTER.findall(spec or SQUEUE_DEFAULT):
        if letter not in LETTERS:
            raise FormatError(f"--format: %{letter} is not supported (supported: %{' %'.join(LETTERS)})")
        header, value = LETTERS[letter]
        size = int(width) if width else max(len(header), 1)
        columns.append(Column(header, value, -size if right else size, truncate=bool(width)))
    return columns
