"""The overlap planner: capture, calibrate, try the passes, keep only what the simulator backs.

For each tile count K it builds the tiled, round-robin reordered graph, simulates it with
costs measured on this machine, lets the DP choose buckets within the memory budget, and
simulates that too. :func:`rota.jobkit.overlap.simulator.decide` then keeps the untransformed graph
unless a candidate is predicted faster and within budget; what it refused, and why, stays in
the plan.

Optionally (``verify_iters``) the choice is also timed against the untransformed graph,
which is timed twice in the same interleaved rounds, and dropped unless it measures faster
by the keep margin: a guard for what the simulator does not model. The margin is the
measured noise, the spread between the two timings of the untransformed graph (never below
VERIFY_MARGIN_FLOOR): a plan that measures only as fast as that noise is as likely to be
slower as faster. On shared cores two timings of one graph have differed by 16%, so a fixed
few percent would keep plans on noise.

The budget, when not given, is the untransformed graph's predicted peak plus 10%: a plan
may trade a little memory for time, never a lot without being asked to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.fx as fx

from rota.jobkit.overlap.bucketing import bucket
from rota.jobkit.overlap.calibrate import calibrate_comm, profile_graph, to_sim_ops
from rota.jobkit.overlap.capture import Captured, collective_kinds
from rota.jobkit.overlap.measure import time_steps
from rota.jobkit.overlap.reorder import reorder
from rota.jobkit.overlap.simulator import CommModel, Decision, SimResult, choose_buckets, decide, simulate
from rota.jobkit.overlap.tiling import tile

__all__ = ["DEFAULT_BUDGET_SLACK", "VERIFY_MARGIN_FLOOR", "Candidate", "OverlapPlan", "Verification", "keep_margin",
           "measured_faster", "plan_overlap", "verify_choice"]

DEFAULT_BUDGET_SLACK = 1.10
VERIFY_MARGIN_FLOOR = 0.03  # ours: the keep margin never drops below 3%, however quiet the two baseline timings
MB = 1 << 20


@dataclass
class Candidate:
    k: int
    buckets: tuple[tuple[str, ...], ...]
    module: fx.GraphModule
    predicted: SimResult


@dataclass(frozen=True)
class Verification:
    """The planner's measured check of its choice: the untransformed graph twice, the choice once."""

    untransformed_s: float
    untransformed_again_s: float
    plan_s: float
    margin: float  # the keep margin these timings set
    kept: bool

    def as_dict(self) -> dict[str, float | bool]:
        return {"untransformed_s": self.untransformed_s, "untransformed_again_s": self.untransformed_again_s,
                "plan_s": self.plan_s, "margin": self.margin, "kept": self.kept}


@dataclass
class OverlapPlan:
    label: str
    k: int
    buckets: tuple[tuple[str, ...], ...]
    module: fx.GraphModule
    predicted: SimResult
    baseline: SimResult
    budget_bytes: int
    comm: CommModel
    refused: dict[str, str] = field(default_factory=dict)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    verification: Verification | None = None

    @property
    def predicted_step_s(self) -> float:
        return self.predicted.makespan_s

    @property
    def predicted_peak_mb(self) -> float:
        return self.predicted.peak_bytes / MB

    def summary(self) -> dict[str, object]:
        """Flat values for ``rota.runtime.report``."""
        return {"overlap_plan": self.label, "overlap_k": self.k, "overlap_buckets": len(self.buckets),
                "predicted_step_s": self.predicted_step_s, "predicted_peak_mb": self.predicted_peak_mb}


def keep_margin(untransformed_s: float, untransformed_again_s: float, floor: float = VERIFY_MARGIN_FLOOR) -> float:
    """The measured noise: how far apart two timings of one graph are, relative to their mean (at least ``floor``)."""
    mean = (untransformed_s + untransformed_again_s) / 2
    spread = abs(untransformed_s - untransformed_again_s) / mean if mean > 0 else 0.0
    return max(floor, spread)


def measured_faster(plan_s: float, untransformed_s: float, margin: float = VERIFY_MARGIN_FLOOR) -> bool:
    """Whether a plan's measured step beats the untransformed one's by at least ``margin``."""
    return plan_s <= untransformed_s * (1 - margin)


def verify_choice(untransformed_s: float, untransformed_again_s: float, plan_s: float) -> Verification:
    """Keep a plan only when it beats the mean of the two untransformed timings by their own spread."""
    margin = keep_margin(untransformed_s, untransformed_again_s)
    reference = (untransformed_s + untransformed_again_s) / 2
    return Verification(untransformed_s, untransformed_again_s, plan_s, margin,
                        measured_faster(plan_s, reference, margin))


def plan_overlap(captured: Captured, group: dist.ProcessGroup, ks: Sequence[int] = (2,),
                 budget_mb: float | None = None, comm: CommModel | None = None, repeats: int = 5,
                 verify_iters: int = 0) -> OverlapPlan:
    """Plan overlap for ``captured`` on ``group``; every rank must call it (it runs collectives).

    ``verify_iters`` > 0 also times the chosen graph against the untransformed one for that
    many interleaved steps and keeps the untransformed graph unless the choice measures
    keep margin faster (:func:`verify_choice`).
    """
    if not ks or any(k < 2 for k in ks):
        raise ValueError(f"ks: tile counts must be at least 2, got {list(ks)}")
    if budget_mb is not None and budget_mb <= 0:
        raise ValueError(f"budget_mb must be positive, got {budget_mb}")
    comm = comm or calibrate_comm(group, collective_kinds(captured.graph))
    base_ops, base_outputs = to_sim_ops(captured.graph, profile_graph(captured.graph, captured.inputs, group,
                                                                      repeats), comm)
    baseline = simulate(base_ops, base_outputs)
    budget = int(budget_mb * MB) if budget_mb is not None else int(baseline.peak_bytes * DEFAULT_BUDGET_SLACK)
    candidates: dict[str, Candidate] = {}
    for k in ks:
        tiled = tile(captured, k)
        profile = profile_graph(tiled, captured.inputs, group, repeats)  # streams one after another: no overlap
        reordered = reorder(tiled)
        ops, outputs = to_sim_ops(reordered, profile, comm)
        candidates[f"tile{k}"] = Candidate(k, (), reordered, simulate(ops, outputs))
        choice = choose_buckets(ops, comm, budget, outputs, max_bucket=k)
        if choice.buckets:
            candidates[f"tile{k}+buckets"] = Candidate(k, choice.buckets, bucket(reordered, choice.buckets),
                                                      choice.result)
    decision = decide(baseline, {label: c.predicted for label, c in candidates.items()}, budget)
    if decision.chosen != "untransformed" and verify_iters:
        # The simulator misses what shared cores do to overlapped work; a short interleaved
        # measurement on the job's own inputs keeps a predicted win that is a measured loss out.
        # The untransformed graph runs twice per round: the gap between its two timings is the
        # noise the keep margin is set from.
        measured = time_steps({"untransformed": captured.graph, "untransformed_again": captured.graph,
                               decision.chosen: candidates[decision.chosen].module}, captured.inputs, group,
                              verify_iters, 1)
        verification = verify_choice(measured["untransformed"], measured["untransformed_again"],
                                     measured[decision.chosen])
        if not verification.kept:
            decision.refused[decision.chosen] = (
                f"measured {verification.plan_s * 1e3:.3f} ms, not {verification.margin:.0%} (the measured noise) "
                f"faster than the untransformed {verification.untransformed_s * 1e3:.3f} / "
                f"{verification.untransformed_again_s * 1e3:.3f} ms (predicted {decision.result.makespan_s * 1e3:.3f} ms)")
            decision = Decision("untransformed", baseline, decision.refused)
    else:
        verification = None
    if decision.chosen == "untransformed":
        return OverlapPlan("untransformed", 1, (), captured.graph, baseline, baseline, budget, comm,
                           decision.refused, candidates, verification)
    chosen = candidates[decision.chosen]
    return OverlapPlan(decision.chosen, chosen.k, chosen.buckets, chosen.module, chosen.predicted, baseline, budget,
                       comm, decision.refused, candidates, verification)
