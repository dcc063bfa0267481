"""A job's use of the overlap planner: opt in, apply the plan, report it to the control plane.

    overlap = rota.jobkit.overlap.runtime.apply_overlap(step, inputs, batch_dims=(0, None, None),
                                                 out_batch_dims=(0,), group=group)
    for i in range(steps):
        out = overlap(*inputs)
        overlap.report(step=i)          # the plan's figures ride along on every report

Calling :func:`apply_overlap` is the opt-in; ``ROTA_OVERLAP=0`` in the job's environment
turns it off without editing the job (the step then runs as captured, untransformed, and
the report says so). The agent shows a job's last progress line, so :meth:`OverlapStep.report`
puts the plan (``overlap_plan``, ``overlap_k``, ``overlap_buckets``, ``predicted_step_s``,
``predicted_peak_mb``) into every line, and ``rota job ID`` shows it beside the job's own
values. Only the group's rank 0 reports by default: one line per step, not one per rank.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from rota.jobkit.overlap.blocks import StepFn
from rota.jobkit.overlap.capture import capture, run_graph
from rota.jobkit.overlap.planner import OverlapPlan, plan_overlap
from rota.runtime import report as runtime_report

__all__ = ["ENV_OVERLAP", "OverlapStep", "apply_overlap", "overlap_enabled"]

ENV_OVERLAP = "ROTA_OVERLAP"


def overlap_enabled() -> bool:
    """False when the job's environment sets ``ROTA_OVERLAP`` to 0/false/off."""
    raw = os.environ.get(ENV_OVERLAP, "1").strip().lower()
    if raw not in ("0", "1", "false", "true", "off", "on", ""):
        raise ValueError(f"{ENV_OVERLAP} must be 0 or 1 (or true/false, on/off), got {raw!r}")
    return raw not in ("0", "false", "off")


class OverlapStep:
    """The planned step: call it like the step; ``report`` adds the plan to progress reports."""

    def __init__(self, plan: OverlapPlan | None, module: Any, rank: int, report_rank: int | None) -> None:
        self.plan = plan
        self._module = module
        self._reports = report_rank is None or rank == report_rank

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return run_graph(self._module, inputs)

    def summary(self) -> dict[str, object]:
        if self.plan is None:
            return {"overlap_plan": "off", "overlap_k": 1, "overlap_buckets": 0}
        return self.plan.summary()

    def report(self, **values: Any) -> None:
        """``rota.runtime.report`` with the plan's figures added (the job's own keys win)."""
        if self._reports:
            runtime_report(**{**self.summary(), **values})


def apply_overlap(step: StepFn, inputs: Sequence[torch.Tensor], batch_dims: Sequence[int | None],
                  out_batch_dims: Sequence[int], group: dist.ProcessGroup, k: int = 2,
                  budget_mb: float | None = None, report_rank: int | None = 0,
                  verify_iters: int = 40) -> OverlapStep:
    """Capture ``step``, plan overlap for it on ``group`` and report the plan once.

    Every rank of ``group`` must call this together (capture and calibration run collectives);
    all ranks get the same plan, since the planner works from measurements max-reduced across
    ranks.
    """
    captured = capture(step, inputs, batch_dims, out_batch_dims)
    rank = dist.get_rank(group)
    if not overlap_enabled():
        result = OverlapStep(None, captured.graph, rank, report_rank)
    else:
        plan = plan_overlap(captured, group, ks=(k,), budget_mb=budget_mb, verify_iters=verify_iters)
        result = OverlapStep(plan, plan.module, rank, report_rank)
    result.report()
    return result
