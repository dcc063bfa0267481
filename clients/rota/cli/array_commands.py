"""The Slurm habits of `rota submit` and `rota jobs`: `--array A-B[:S][%K]` (or a job file's
`array:`) submits one job per index in one call; `--after ID` (repeatable) makes the job
wait for each parent's success; `rota jobs` shows an array as one row with its tasks
counted by state (`--expand` lists the tasks)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rota.cli.output import ago, print_json, table
from rota.client.arrays import JobArray
from rota.client.enums import JobState
from rota.client.jobfile import array_of, load_job_file
from rota.client.jobspec import Dependency, JobSpec

if TYPE_CHECKING:  # the gRPC client: `rota submit` over HTTP imports this module without it
    from rota.client import Client, Job

STATE_ORDER = (JobState.RUNNING, JobState.SCHEDULED, JobState.PENDING, JobState.PAUSED, JobState.LOST,
               JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def array_text(args: argparse.Namespace) -> str | None:
    """The array to submit: `--array` over the file's `array:`; None: a single job."""
    flag = getattr(args, "array", None)
    if flag:
        return str(flag)
    if len(args.files) != 1:
        return None
    return array_of(load_job_file(args.files[0]))


def with_after(spec: JobSpec, after: Sequence[str] | None) -> JobSpec:
    """`--after ID`: each parent must succeed first (Slurm's --dependency=afterok:ID)."""
    depends = [Dependency(d) if isinstance(d, str) else d for d in spec.depends_on]
    for parent in after or ():
        if all(d.job != parent for d in depends):
            depends.append(Dependency(parent, "succeeded"))
    return dataclasses.replace(spec, depends_on=tuple(depends)) if after else spec


def check_array_flags(args: argparse.Namespace) -> None:
    for flag, given in (("--what-if", args.what_if), ("--wait", args.wait)):
        if given:
            raise ValueError(f"{flag}: not with an array (submit it, then `rota jobs`)")
    if len(args.files) != 1:
        raise ValueError(f"--array: one FILE at a time (got {len(args.files)})")


def submit_array(args: argparse.Namespace, spec: JobSpec, indices: str,
                 connect: Callable[[argparse.Namespace], Client]) -> int:
    check_array_flags(args)
    with connect(args) as client:
        submitted = client.submit_array(spec=spec, indices=indices, request_id=args.request_id)
    return print_array(args, submitted)


def print_array(args: argparse.Namespace, submitted: JobArray) -> int:
    """What `rota submit --array` prints, over gRPC or HTTP alike."""
    if args.json:
        print_json({"array": submitted.id, "jobs": submitted.job_ids, "count": submitted.count})
    else:
        cap = f", at most {submitted.max_running} at once" if submitted.max_running else ""
        first, last = (submitted.job_ids[0], submitted.job_ids[-1]) if submitted.job_ids else ("-", "-")
        print(f"submitted array {submitted.id} ({submitted.name}: {submitted.count} tasks {first} .. {last}{cap})"
              f" from {Path(args.files[0]).name}")
    return 0


def grouped_table(found: Sequence[Job], arrays: Sequence[JobArray], job_rows: Callable[[Sequence[Job]], str]) -> str:
    """Jobs as `job_rows` shows them, each array's tasks folded into one row (its position:
    its newest listed task's) whose state column counts every task by state."""
    by_id = {a.id: a for a in arrays}
    singles = [j for j in found if not j.array_id or j.array_id not in by_id]
    text = job_rows(singles) if singles else ""
    shown = [by_id[i] for i in dict.fromkeys(j.array_id for j in found if j.array_id in by_id)]
    if not shown:
        return text or job_rows([])
    rows = [(a.id, a.name, a.tenant, a.count, a.max_running or "-", _counts(a.states), ago(a.created_at))
            for a in shown]
    arrays_text = table(("ARRAY", "NAME", "TENANT", "TASKS", "AT ONCE", "STATES", "SUBMITTED"), rows)
    return f"{text}\n\n{arrays_text}" if text else arrays_text


def _counts(states: dict[JobState, int]) -> str:
    order: dict[JobState, int] = {s: i for i, s in enumerate(STATE_ORDER)}
    return " ".join(f"{s.lower()}={n}" for s, n in sorted(states.items(), key=lambda kv: order.get(kv[0], 99)) if n)


def cancel(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Client]) -> int:
    """`rota cancel ID`: a job, or every unfinished task of an array. A job that had already
    finished is left as it is, and said so (exit 0: what was asked for, a job that no longer
    runs, holds)."""
    from rota.client.errors import NotFoundError

    with connect(args) as client:
        try:
            before: Job | None = client.get_job(args.id)
        except NotFoundError:
            before = None  # an array's id (or nothing: the cancel says NOT_FOUND)
        found = before if before is not None and before.finished else client.cancel_job_or_array(
            args.id, reason=args.reason)
    if args.json:
        print_json(found.to_dict())
    else:
        print(cancel_text(found, already=found is before))
    return 0


def cancel_text(found: Job | JobArray, *, already: bool) -> str:
    """What `rota cancel` prints: what it stopped, or that there was nothing left to stop."""
    if isinstance(found, JobArray):
        if not found.job_ids:
            return f"{found.id}: every task had already finished, nothing to cancel ({_counts(found.states)})"
        return f"{found.id} cancelled: {len(found.job_ids)} tasks stopped ({_counts(found.states)})"
    if already:
        return f"{found.id}: already {found.state}, nothing to cancel"
    return f"{found.id} {found.state}"


def show_array(args: argparse.Namespace, client: Client, array_id: str) -> int:
    """`rota job ARRAY`: the array, its tasks counted by state, and the ids of its tasks.
    NOT_FOUND (the job's message) when the id names neither a job nor an array."""
    from rota.client.errors import NotFoundError

    try:
        found = client.get_array(array_id)
    except NotFoundError:
        raise NotFoundError(f"job {array_id} not found (nor an array of that id)") from None
    if args.json:
        print_json(found.to_dict())
        return 0
    cap = found.max_running or "no cap"
    print(f"{found.id}  array {found.name}  tenant {found.tenant}  {found.count} tasks, at most {cap} at once"
          f"  submitted {ago(found.created_at)}")
    print(f"  states: {_counts(found.states) or '-'}")
    ids = found.job_ids
    shown = ids if len(ids) <= 8 else [*ids[:3], "...", *ids[-3:]]
    print(f"  tasks: {' '.join(shown)}   (rota jobs --expand lists them)")
    return 0
