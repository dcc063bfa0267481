"""Trace files of `rota sim` (docs/design.md §4): JOBS.csv and TENANTS.csv, read and written.

JOBS.csv:    job_id,tenant,submit_s,duration_s,gpus[,priority][,gpu_types][,same_switch]
             (duration = run time on the requested GPUs; priority 1..10, default 1,
             is the job's weight w_j in its tenant's share; gpu_types the types it
             accepts, separated by `|`, empty = any; same_switch 1 = its block under
             one switch. The last two columns are written only when some job has them.)
TENANTS.csv: tenant,share
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Job:
    id: str
    tenant: str
    submit_s: float
    duration_s: float
    gpus: int
    priority: int = 1
    gpu_types: frozenset[str] = field(default=frozenset())
    same_switch: bool = False


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
                    gpu_types=frozenset(t for t in (row.get("gpu_types") or "").split("|") if t),
                    same_switch=_flag(row.get("same_switch") or "0"),
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


def _flag(v: str) -> bool:
    if v not in ("0", "1"):
        raise ValueError(f"same_switch must be 0 or 1, got {v!r}")
    return v == "1"


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
        placed = any(j.gpu_types or j.same_switch for j in jobs)  # untyped traces keep the old columns
        w.writerow(["job_id", "tenant", "submit_s", "duration_s", "gpus", "priority",
                    *(["gpu_types", "same_switch"] if placed else [])])
        for j in jobs:
            row: list[object] = [j.id, j.tenant, _num(j.submit_s), _num(j.duration_s), j.gpus, j.priority]
            if placed:
                row += ["|".join(sorted(j.gpu_types)), int(j.same_switch)]
            w.writerow(row)


def write_tenants(path: str | Path, shares: dict[str, float]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tenant", "share"])
        for t, s in shares.items():
            w.writerow([t, _num(s)])


def parse_gpu_types(spec: str) -> tuple[str, ...]:
    """`a100:8,h100:4` -> the GPU type of each node, in node order (8 a100 nodes, then 4 h100)."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, count = part.partition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--gpu-types: {part!r} is not TYPE:NODES (e.g. h100:8)")
        out += [name] * int(count)
    if not out:
        raise ValueError("--gpu-types: name at least one TYPE:NODES")
    return tuple(out)


def node_switches(nodes: int, per_switch: int) -> tuple[str, ...]:
    """Consecutive nodes share a switch, `per_switch` of them to each (the last may have fewer)."""
    if per_switch < 1:
        raise ValueError(f"--switches: nodes per switch must be at least 1, got {per_switch}")
    return tuple(f"s{i // per_switch}" for i in range(nodes))
