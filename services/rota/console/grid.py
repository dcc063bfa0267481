"""Pure view models of the console's grids: the plan (GPU rows x timesteps) and the cluster
(nodes x GPUs), from plain data, with a colour per job.

Colours come from the job id alone (a hash to a hue), so a job keeps its colour across
refreshes, pages and console replicas without any state. A tenant's view has other
tenants' cells as "*" (the api blanks them in the plan; the console does the same for the
holders of the node table, which the api lists for everyone).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OTHER = "*"  # another tenant's job, as the api writes it in the plan


def job_colour(job_id: str) -> str:
    """A stable, readable background colour for a job ("" idle, grey for another tenant's)."""
    if not job_id:
        return ""
    if job_id == OTHER:
        return "#c8c8c8"
    hue = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:2], "big") % 360
    return f"hsl({hue}, 65%, 72%)"


@dataclass(frozen=True)
class Cell:
    job: str  # "" idle, "*" another tenant's, else a job id
    colour: str
    span: int = 1  # consecutive steps of the same job on the row, drawn as one cell

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "colour": self.colour, "span": self.span}


@dataclass(frozen=True)
class GridRow:
    label: str
    cells: list[Cell]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "cells": [c.to_dict() for c in self.cells]}


@dataclass(frozen=True)
class PlanGrid:
    """GPU rows x timesteps; `steps` the column headings (seconds from the step's start)."""

    epoch: int
    created_at: str | None
    policy: str
    trigger: str
    step_seconds: float
    steps: list[int]
    rows: list[GridRow]
    legend: list[tuple[str, str]] = field(default_factory=list)  # (job, colour), in order of appearance
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def busy_cells(self) -> int:
        return sum(c.span for r in self.rows for c in r.cells if c.job)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "created_at": self.created_at, "policy": self.policy, "trigger": self.trigger,
            "step_seconds": self.step_seconds, "steps": self.steps, "rows": [r.to_dict() for r in self.rows],
            "legend": [{"job": j, "colour": c} for j, c in self.legend], "figures": self.figures,
        }


def runs(cells: Sequence[str]) -> list[Cell]:
    """A row's cells with consecutive equal jobs merged into one spanning cell."""
    out: list[Cell] = []
    for job in cells:
        job = job or ""
        if out and out[-1].job == job:
            out[-1] = Cell(job, out[-1].colour, out[-1].span + 1)
        else:
            out.append(Cell(job, job_colour(job)))
    return out


def plan_grid(plan: Mapping[str, Any]) -> PlanGrid:
    """The grid of a plan as `CurrentPlan.to_dict()` writes it (gpu_labels, grid, ...).

    As the caller's token got it: the allocator already masked other tenants' jobs, in the
    cells ("*") and in the trigger's words (rota.allocator.service.visible_trigger), and
    shows the caller's own, even those that left the plan ("completion of j-...")."""
    grid: list[list[str]] = [list(r) for r in plan.get("grid") or []]
    trigger = str(plan.get("trigger") or "")
    labels: list[str] = list(plan.get("gpu_labels") or [])
    width = max((len(r) for r in grid), default=int(plan.get("horizon") or 0))
    labels += [f"gpu {i}" for i in range(len(labels), len(grid))]
    legend: dict[str, str] = {}
    for row in grid:
        for job in row:
            if job and job not in legend:
                legend[job] = job_colour(job)
    return PlanGrid(
        epoch=int(plan.get("epoch") or 0), created_at=plan.get("created_at"), policy=str(plan.get("policy") or ""),
        trigger=trigger, step_seconds=float(plan.get("step_seconds") or 0.0),
        steps=list(range(width)), rows=[GridRow(label, runs(row)) for label, row in zip(labels, grid, strict=False)],
        legend=list(legend.items()), figures=dict(plan.get("figures") or {}),
    )


@dataclass(frozen=True)
class GpuSlot:
    index: int
    type: str
    holder: str  # "" idle, "*" another tenant's job, else a job id
    colour: str
    bad: bool = False  # out of the plan by the failure detector


@dataclass(frozen=True)
class NodeRow:
    name: str
    health: str
    switch: str
    gpu_types: list[str]
    heartbeat: str | None
    gpus: list[GpuSlot]

    @property
    def busy(self) -> int:
        return sum(1 for g in self.gpus if g.holder)


def visible_holder(job_id: str, own: set[str] | None) -> str:
    """What a viewer sees of a GPU's holder: everything (own is None: the admin), else the
    job when it is one of theirs and "*" for anyone else's."""
    if not job_id or own is None or job_id in own:
        return job_id
    return OTHER


def node_rows(nodes: Iterable[Mapping[str, Any]], own: set[str] | None,
              bad: Iterable[tuple[str, int]] = ()) -> list[NodeRow]:
    """Nodes as `Node.to_dict()` writes them, with holders as the viewer may see them."""
    out_of_plan = set(bad)
    rows = []
    for n in nodes:
        gpus = []
        for g in n.get("gpus") or []:
            holder = visible_holder(g.get("job") or "", own)
            gpus.append(GpuSlot(int(g["index"]), str(g.get("type") or ""), holder, job_colour(holder),
                                (str(n["name"]), int(g["index"])) in out_of_plan))
        labels = n.get("labels") or {}
        rows.append(NodeRow(str(n["name"]), str(n.get("health") or ""), str(labels.get("switch", "")),
                            sorted({g.type for g in gpus if g.type}), n.get("last_heartbeat"), gpus))
    return rows


def progress_fraction(progress: Mapping[str, Any]) -> float | None:
    """step / total when the job reports both (rota.runtime.report(step=, total=)), in [0, 1]."""
    step, total = progress.get("step"), progress.get("total")
    if not isinstance(step, int | float) or not isinstance(total, int | float) or total <= 0:
        return None
    return max(0.0, min(1.0, float(step) / float(total)))


@dataclass(frozen=True)
class ProgressPanel:
    """A group of a job's progress values that one of Rota's job-side libraries reports,
    shown together under its own title (rows of label and text)."""

    id: str
    title: str
    rows: list[tuple[str, str]]


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else "-"


def progress_panels(progress: Mapping[str, Any]) -> list[ProgressPanel]:
    """The panels a job's progress fills: an agentic batch's admission control (CONCUR), an
    overlap plan (Helix), a pipeline's bubbles (Hydro); none for a plain job."""
    panels: list[ProgressPanel] = []
    p = progress
    if "window" in p and "hit_rate" in p:
        done = f"{p.get('agents_done', '-')} of {p.get('agents', '-')}"
        panels.append(ProgressPanel("admission", "Admission control", [
            ("Window", f"{p['window']} agents ({p.get('active', '-')} active, {p.get('held', '-')} held)"),
            ("KV cache usage", _pct(p.get("usage"))), ("Prefix hit rate", _pct(p.get("hit_rate"))),
            ("Recomputed per generated token", _num(p.get("recompute_ratio", "-"))),
            ("Agents done", done), ("Tokens/s", _num(p.get("tokens_per_s", "-"), 4)),
            ("Last decision", str(p.get("signal", "-"))),
        ]))
    if "overlap_plan" in p:
        measured = p.get("step_s")
        predicted = p.get("predicted_step_s")
        error = (f" (measured {_num(measured)} s, {100 * (measured / predicted - 1):+.0f}%)"
                 if isinstance(measured, int | float) and isinstance(predicted, int | float) and predicted > 0 else "")
        panels.append(ProgressPanel("overlap", "Overlap plan", [
            ("Plan", str(p["overlap_plan"])), ("Tile streams (K)", _num(p.get("overlap_k", "-"))),
            ("Buckets", _num(p.get("overlap_buckets", "-"))),
            ("Predicted step", f"{_num(predicted)} s{error}" if predicted is not None else "-"),
            ("Predicted peak memory", f"{_num(p.get('predicted_peak_mb', '-'))} MB"),
        ]))
    if "bubble_s" in p and isinstance(p.get("step_s"), int | float) and p["step_s"] > 0:
        panels.append(ProgressPanel("bubbles", "Pipeline bubbles", [
            ("Step", f"{_num(p['step_s'])} s"),
            ("In bubbles", f"{_num(p['bubble_s'])} s ({_pct(p['bubble_s'] / p['step_s'])} of the step)"),
        ]))
    return panels
