"""`rota bench moves [--steps N] [--seed S] [--json]`: what priced preemption and
fragmentation repair are worth, against the same planner that never moves a started job.

A rolling-horizon simulation of the live loop (pure: `plan_live` on plain data, no
cluster): two 8-GPU nodes, a seeded stream of long low-priority preemptible jobs that
keeps the cluster full, and short high-priority jobs arriving among them. Every step the
planner runs; its starts are taken, and with moves on, its preemption or migrations are
applied at once (a live pause frees GPUs in seconds, a plan step is a minute): the moved
job loses its pause-plus-restore time of work and is requeued (held back until the job it
made room for has started) to resume anywhere, or on its target node after a migration.
A moved job is not moved again for SETTLE_STEPS. Both runs see the same jobs.

Printed: per priority class, the mean wait from arrival to first start and the mean
completion time (of the jobs completed in the window), how many completed and the
GPU-hours each class ran; priority-weighted completion time; GPU utilisation (a moved
job's lost time counts as used); how many moves and the GPU-seconds they cost; and the
ratios baseline / moves (utilisation: moves / baseline).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from rota.core.planning.liveplan import Horizon, LiveJob, LiveNode
from rota.core.planning.moves import MoveCost, MoveInputs
from rota.core.planning.planner import plan_live

STEP_S = 60.0
HORIZON = 16
NODES = (LiveNode("n1", 8), LiveNode("n2", 8))
MOVE = MoveCost(pause_s=2.0, restore_s=6.0)  # about a 500 MB state here (bench/checkpoint)
SETTLE_STEPS = 10  # as the live loop's SETTLE_S: a moved job is not moved again this soon


@dataclass
class SimJob:
    id: str
    priority: int
    gpus: int
    work_s: float  # seconds of running it needs, grown by each move it suffers
    arrival: int  # step
    started: int | None = None  # first start
    done: int | None = None
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    ran_s: float = 0.0
    moves: int = 0
    moved_at: int = -1_000_000  # step of its last move


@dataclass
class Run:
    jobs: list[SimJob]
    busy_gpu_steps: int = 0
    preemptions: int = 0
    migrations: int = 0
    held_back: dict[str, str] = field(default_factory=dict)  # moved job -> the job it made room for
    targets: dict[str, str] = field(default_factory=dict)


def workload(seed: int, steps: int) -> list[SimJob]:
    rng = random.Random(seed)
    jobs: list[SimJob] = []
    for t in range(steps):
        # Low-priority, preemptible training: about 1.3x the cluster's GPU-steps.
        if rng.random() < 0.35:
            jobs.append(SimJob(f"low-{len(jobs)}", 1, rng.choice((1, 2, 2, 4, 4, 8)), rng.uniform(15, 60) * STEP_S, t))
        # High-priority, short jobs, now and then.
        if rng.random() < 0.12:
            jobs.append(SimJob(f"high-{len(jobs)}", 8, rng.choice((1, 2, 4)), rng.uniform(2, 8) * STEP_S, t))
    return jobs


def simulate(jobs: list[SimJob], steps: int, moves: bool) -> Run:
    run = Run([replace(j) for j in jobs])
    for t in range(steps):
        now = t * STEP_S
        for _round in range(3):  # a move frees GPUs at once: re-plan within the step
            if not _cycle(run, t, now, moves):
                break
        for j in run.jobs:
            if j.node is not None:
                j.ran_s += STEP_S
                run.busy_gpu_steps += j.gpus
                if j.ran_s >= j.work_s - 1e-9:
                    j.done, j.node, j.gpu_indices = t + 1, None, ()
    return run


def _cycle(run: Run, t: int, now: float, moves: bool) -> bool:
    """One planning cycle; True when it moved a job (the caller plans again)."""
    by_id = {j.id: j for j in run.jobs}
    live = [_live(j, t) for j in run.jobs if j.arrival <= t and j.done is None]
    queued = {j.id for j in live if j.node is None}
    run.held_back = {y: to for y, to in run.held_back.items() if to in queued}
    costs = {j.id: MOVE for j in live if j.node is not None and j.preemptible} if moves else {}
    resting = frozenset(j.id for j in run.jobs if t - j.moved_at < SETTLE_STEPS)
    inputs = MoveInputs(costs=costs, targets={k: v for k, v in run.targets.items() if k in queued}, busy=resting)
    out = plan_live(list(NODES), live, Horizon(STEP_S, HORIZON, now), "fast", held_back=dict(run.held_back),
                    moves=inputs)
    for s in out.decision.starts:
        j = by_id[s.job_id]
        j.node, j.gpu_indices = s.node, s.gpus
        j.started = t if j.started is None else j.started
        run.targets.pop(j.id, None)
    moved = False
    if out.preemption is not None:
        victim = by_id[out.preemption.job_id]
        _pause(victim, t)
        run.held_back[victim.id] = out.preemption.for_job
        run.preemptions += 1
        moved = True
    for m in out.migrations:
        _pause(by_id[m.job_id], t)
        run.targets[m.job_id] = m.to_node
        run.held_back[m.job_id] = m.for_job
        run.migrations += 1
        moved = True
    return moved


def _pause(j: SimJob, t: int) -> None:
    j.node, j.gpu_indices, j.moved_at = None, (), t
    j.work_s += MOVE.seconds  # the pause and the restore: time it runs without progress
    j.moves += 1


def _live(j: SimJob, t: int) -> LiveJob:
    return LiveJob(j.id, "t", "training", j.priority, j.gpus, node=j.node, gpu_indices=j.gpu_indices,
                   elapsed_s=j.ran_s if j.node else 0.0, duration_s=j.work_s if j.node else j.work_s - j.ran_s,
                   preemptible=j.priority == 1)


def figures(run: Run, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"preemptions": run.preemptions, "migrations": run.migrations,
                           "moved_gpu_seconds": sum(j.moves * j.gpus * MOVE.seconds for j in run.jobs),
                           "utilization": run.busy_gpu_steps / (steps * sum(n.gpus for n in NODES))}
    weighted = total = 0.0
    for cls, priority in (("high", 8), ("low", 1)):
        done = [j for j in run.jobs if j.priority == priority and j.done is not None and j.started is not None]
        waits = [(j.started or 0) - j.arrival for j in done]
        jcts = [(j.done or 0) - j.arrival for j in done]
        progress = sum(min(j.ran_s, j.work_s) * j.gpus for j in run.jobs if j.priority == priority) / 3600
        out[cls] = {"completed": len(done), "mean_wait_steps": _mean(waits), "mean_jct_steps": _mean(jcts),
                    "gpu_hours_run": progress}
        weighted += priority * sum(jcts)
        total += priority * len(done)
    out["weighted_jct_steps"] = weighted / total if total else 0.0
    return out


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rota bench moves", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=240, help="plan steps simulated (default 240)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps: must be at least 1")
    jobs = workload(args.seed, args.steps)
    base, moved = (figures(simulate(jobs, args.steps, m), args.steps) for m in (False, True))
    ratios = {
        "high_wait": _ratio(base["high"]["mean_wait_steps"], moved["high"]["mean_wait_steps"]),
        "weighted_jct": _ratio(base["weighted_jct_steps"], moved["weighted_jct_steps"]),
        # Low-priority throughput (moves / baseline): its JCT over completed jobs alone would
        # flatter the moves, since the long jobs they delay past the window drop out of it.
        "low_gpu_hours": _ratio(moved["low"]["gpu_hours_run"], base["low"]["gpu_hours_run"]),
        "utilization": _ratio(moved["utilization"], base["utilization"]),
    }
    result = {"steps": args.steps, "seed": args.seed, "jobs": len(jobs), "baseline": base, "moves": moved,
              "ratios": ratios}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(jobs)} jobs over {args.steps} steps of {STEP_S:.0f}s on {len(NODES)}x8 GPUs; a move costs "
          f"{MOVE.seconds:.0f}s of the moved job's work")
    print(f"{'':24}{'no moves':>12}{'moves':>12}{'ratio':>8}")
    rows = [("high: mean wait (steps)", base["high"]["mean_wait_steps"], moved["high"]["mean_wait_steps"], ratios["high_wait"]),
            ("high: mean JCT (steps)", base["high"]["mean_jct_steps"], moved["high"]["mean_jct_steps"], None),
            ("low: mean JCT (steps)", base["low"]["mean_jct_steps"], moved["low"]["mean_jct_steps"], None),
            ("weighted JCT (steps)", base["weighted_jct_steps"], moved["weighted_jct_steps"], ratios["weighted_jct"]),
            ("utilization", base["utilization"], moved["utilization"], ratios["utilization"]),
            ("high: completed", base["high"]["completed"], moved["high"]["completed"], None),
            ("low: completed", base["low"]["completed"], moved["low"]["completed"], None),
            ("high: GPU-hours run", base["high"]["gpu_hours_run"], moved["high"]["gpu_hours_run"], None),
            ("low: GPU-hours run", base["low"]["gpu_hours_run"], moved["low"]["gpu_hours_run"], ratios["low_gpu_hours"])]
    for name, b, m, r in rows:
        print(f"{name:24}{b:12.3f}{m:12.3f}{'' if r is None else f'{r:8.2f}'}")
    print(f"moves: {moved['preemptions']} preemptions, {moved['migrations']} migrations, "
          f"{moved['moved_gpu_seconds']:.0f} GPU-seconds of work redone or waited")
    return 0


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
