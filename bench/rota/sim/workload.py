"""Trace files of `rota sim` (SPEC §4): JOBS.csv and TENANTS.csv, read and written.

JOBS.csv:    job_id,tenant,submit_s,duration_s,gpus[,priority]
             (duration = run time on the requested GPUs; priority 1..10, default 1,
             is the job's weight w_j in its tenant's share)
TENANTS.csv: tenant,share
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    id: str
    tenant: str
    submit_s: float
    duration_s: float
    gpus: int
    priority: int = 1


class TraceError(ValueError):
    """A trace row that cannot be simulated; the message names the file, row and field."""


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def read_jobs(path: str | Path) -> list[Job]:
    jobs: list[Job] = []
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                job = Job(
                    id=row["job_id"],
                    tenant=row["tenant"],
                    submit_s=float(row["submit_s"]),
                    duration_s=float(row["duration_s"]),
                    gpus=int(row["gpus"]),
                    priority=int(row.get("priority") or 1),
                )
            except (KeyError, ValueError, TypeError) as e:
                raise TraceError(f"{path}:{line}: bad row ({e})") from e
            if not _is_pow2(job.gpus):
                raise TraceError(f"{path}:{line}: gpus must be a power of two, got {job.gpus}")
            if job.duration_s <= 0 or job.submit_s < 0:
                raise TraceError(f"{path}:{line}: duration_s must be > 0 and submit_s >= 0")
            jobs.append(job)
    ids = {j.id for j in jobs}
    if len(ids) != len(jobs):
        raise TraceError(f"{path}: job_id values are not unique")
    return jobs


def read_tenants(path: str | Path) -> dict[str, float]:
    shares: dict[str, float] = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                shares[row["tenant"]] = float(row["share"])
            except (KeyError, ValueError, TypeError) as e:
                raise TraceError(f"{path}:{line}: bad row ({e})") from e
    return shares


def _num(x: float) -> str:
    """Up to millisecond precision without float noise (the `g` format would round to 6 digits)."""
    return f"{x:.3f}".rstrip("0").rstrip(".")


def write_jobs(path: str | Path, jobs: list[Job]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "tenant", "submit_s", "duration_s", "gpus", "priority"])
        for j in jobs:
            w.writerow([j.id, j.tenant, _num(j.submit_s), _num(j.duration_s), j.gpus, j.priority])


def write_tenants(path: str | Path, shares: dict[str, float]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tenant", "share"])
        for t, s in shares.items():
            w.writerow([t, _num(s)])
