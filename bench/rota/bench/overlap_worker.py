"""One rank of one ``rota bench overlap`` case (launched by :mod:`rota.bench.overlap`).

Every rank plans (calibration and planning are collective), then times, on the same inputs:
the untransformed graph (twice, for the noise between two timings of one graph), Inductor's
own compute/communication reordering when it compiles here, Rota's chosen graph, and the
compute-only twins of both graphs; and samples peak heap. Rota's figures are always its own
fresh measurements, also when the plan fell back to the untransformed graph (then the gap to
the baseline is noise, and is reported as such, not hidden by copying the baseline's number).
Rank 0 writes the case's figures as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rota.jobkit.overlap.blocks import BLOCK_NAMES, BlockSize, make_block
from rota.jobkit.overlap.calibrate import calibrate_comm
from rota.jobkit.overlap.capture import capture_block, collective_kinds, run_graph
from rota.jobkit.overlap.measure import measure_peak_bytes, strip_comm, time_steps
from rota.jobkit.overlap.planner import MB, plan_overlap

__all__ = ["case_times", "main"]


def _inductor(step: Any, inputs: tuple[torch.Tensor, ...],
              ref: tuple[torch.Tensor, ...]) -> tuple[Any | None, str | None]:
    """Inductor with reorder_for_compute_comm_overlap: (compiled step, None) or (None, why not)."""
    try:
        import torch._inductor.config as inductor_config
        inductor_config.reorder_for_compute_comm_overlap = True  # with its default passes
        compiled = torch.compile(step, fullgraph=True)
        out = run_graph(compiled, inputs)  # compiles here
        if not all(torch.allclose(o, r, rtol=1e-4, atol=1e-5) for o, r in zip(out, ref, strict=True)):
            return None, "Inductor's compiled step does not match the untransformed outputs"
        return compiled, None
    except Exception as error:  # an unsupported build is a result to report, not a crash
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def case_times(measured: dict[str, float]) -> dict[str, float]:
    """The case's step figures from one interleaved measurement: each its own timing, none copied."""
    baseline, rota = measured["baseline"], measured["rota"]
    return {"baseline_s": baseline, "baseline_again_s": measured["baseline_again"], "rota_s": rota,
            "exposed_comm_before_s": max(0.0, baseline - measured["compute_before"]),
            "exposed_comm_after_s": max(0.0, rota - measured["compute_after"])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="one rank of an overlap bench case")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--block", choices=BLOCK_NAMES, required=True)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--model", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--verify", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    os.environ.update(MASTER_ADDR=args.master, MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world, timeout=timedelta(seconds=300))
    torch.set_num_threads(1)  # several ranks share the cores
    group = dist.group.WORLD
    assert group is not None
    try:
        size = BlockSize(batch=args.batch, seq=args.seq, model=args.model, hidden=args.hidden)
        block = make_block(args.block, group, args.rank, args.world, size)
        captured = capture_block(block)
        started = time.perf_counter()
        comm = calibrate_comm(group, collective_kinds(captured.graph))
        plan = plan_overlap(captured, group, ks=(args.k,), comm=comm, verify_iters=args.verify)
        planning_s = time.perf_counter() - started
        ref = run_graph(captured.graph, block.inputs)
        variants: dict[str, Any] = {"baseline": captured.graph, "baseline_again": captured.graph, "rota": plan.module,
                                    "compute_before": strip_comm(captured.graph),
                                    "compute_after": strip_comm(plan.module)}
        variants.update({f"candidate:{label}": c.module for label, c in plan.candidates.items()})
        inductor_why: str | None = "skipped (--no-inductor)"
        if args.inductor:
            compiled, inductor_why = _inductor(block.step, block.inputs, ref)
            if compiled is not None:
                variants["inductor"] = compiled
        measured = time_steps(variants, block.inputs, group, args.iters)
        inductor_s = measured.get("inductor")
        forced = {k.split(":", 1)[1]: v for k, v in measured.items() if k.startswith("candidate:")}
        peak_before = measure_peak_bytes(captured.graph, block.inputs, group)
        peak_after = measure_peak_bytes(plan.module, block.inputs, group)  # sampled again even for the same graph
        verification = plan.verification
        if args.rank == 0:
            case = {
                "block": args.block, "ranks": args.world, **case_times(measured), "inductor_s": inductor_s,
                "peak_mb_before": peak_before / MB, "peak_mb_after": peak_after / MB,
                "predicted_s": plan.predicted_step_s, "predicted_peak_mb": plan.predicted_peak_mb,
                "plan_kept": plan.label != "untransformed",
                "keep_margin": verification.margin if verification else None,
            }
            detail = {
                "plan": plan.label, "k": plan.k, "buckets": [list(b) for b in plan.buckets], "refused": plan.refused,
                "predicted_baseline_s": plan.baseline.makespan_s, "predicted_baseline_peak_mb": plan.baseline.peak_bytes / MB,
                "candidates_measured_s": forced,
                "candidates_predicted_s": {k: c.predicted.makespan_s for k, c in plan.candidates.items()},
                "compute_only_before_s": measured["compute_before"], "compute_only_after_s": measured["compute_after"],
                "inductor_reason": inductor_why, "planning_s": planning_s,
                "verification": verification.as_dict() if verification else None,
                "comm_alpha_s": dict(comm.alpha_s), "comm_beta_s_per_byte": dict(comm.beta_s_per_byte),
            }
            Path(args.out).write_text(json.dumps({"case": case, "detail": detail}))
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
