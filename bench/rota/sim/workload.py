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
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.core.schema import Field, Schema, SchemaError, validate


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
    # The duration the planner believes (`rota sim --durations`, rota.sim.estimates);
    # None: the true one. The job always runs `duration_s`.
    planned_s: float | None = None

    @property
    def planned(self) -> float:
        return self.duration_s if self.planned_s is None else self.planned_s


class TraceError(ValueError):
    """A trace row that cannot be simulated; the message names the file, row and field."""


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _read(kind: type) -> Callable[[str], Any]:
    """A CSV cell as `kind`, or the text itself (which the field's type check then names)."""
    def convert(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            return text
    return convert


def _number(**options: Any) -> Field:
    return Field(kind=float, what="a number", required=True, convert=_read(float), **options)


def _finite(x: float) -> str | None:
    return None if math.isfinite(x) else f"must be a finite number (got {x})"


# A JOBS.csv row; empty optional cells take the default.
JOB_ROW = Schema({
    "job_id": Field(required=True),
    "tenant": Field(required=True),
    "submit_s": _number(low=0, range_reason="must be >= 0 (got {value})", checks=(_finite,)),
    "duration_s": _number(checks=(lambda d: None if d > 0 and math.isfinite(d) else f"must be > 0 (got {d})",)),
    "gpus": Field(kind=int, what="an integer", required=True, convert=_read(int),
                  checks=(lambda n: None if _is_pow2(n) else f"must be a power of two, got {n}",)),
    "priority": Field(kind=int, what="an integer", default=1, convert=_read(int)),
    "gpu_types": Field(default=frozenset(), convert=lambda v: frozenset(t for t in v.split("|") if t)),
    "same_switch": Field(default="0", choices=("0", "1"), choices_reason="must be 0 or 1, got {value}"),
})
TENANT_ROW = Schema({"tenant": Field(required=True), "share": _number(checks=(_finite,))})


def _rows(path: str | Path, schema: Schema) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each row of a CSV file checked against `schema`, with its line number; TraceError
    names the file, the line and the field."""
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            # A short row leaves None, an empty cell "": both are absent; extra cells are unknown.
            cells = {("(extra cells)" if k is None else k): v for k, v in row.items() if v not in (None, "")}
            try:
                yield line, validate(schema, cells)
            except SchemaError as e:
                raise TraceError(f"{path}:{line}: {e}") from None


def read_jobs(path: str | Path) -> list[Job]:
    jobs = [
        Job(id=r["job_id"], tenant=r["tenant"], submit_s=r["submit_s"], duration_s=r["duration_s"], gpus=r["gpus"],
            priority=r["priority"], gpu_types=r["gpu_types"], same_switch=r["same_switch"] == "1")
        for _, r in _rows(path, JOB_ROW)
    ]
    ids = {j.id for j in jobs}
    if len(ids) != len(jobs):
        raise TraceError(f"{path}: job_id values are not unique")
    return jobs


def read_tenants(path: str | Path) -> dict[str, float]:
    return {r["tenant"]: r["share"] for _, r in _rows(path, TENANT_ROW)}


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
