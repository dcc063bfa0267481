"""A real pipeline-parallel job that reports its bubble windows: 2 stages, gloo, GPipe.

    python examples/pipeline_bubbles.py --steps 20 [--squeeze-pid PID] [--timeline FILE]

Two stage processes (ranks 0 and 1, one core each with --cores) train an MLP split in half
with ``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe``). Each stage
takes its own timestamps at its compute edges (``rota.jobkit.tuning.bubbles``); stage 0 reports
every step through ``rota.runtime.report`` (step time, bubble time, its bubble windows in
ms from the step's start) and, with --timeline, writes all its windows to a JSON file at the
end. With --squeeze-pid, stage 0 lets that process run only inside its bubbles (SIGCONT at
a compute end, SIGSTOP at a compute start); with --watch-pid it only measures that
process's CPU time inside the bubbles (a trial that is always running); with --cycle-pid
it cycles the three arms step by step (trial stopped, always running, squeezed).

Run by Rota, stage 0 squeezes the guests the allocator placed in its bubbles (``kind: trial``
jobs, read each step from ``rota.runtime.bubble_guests()``), and lets them run freely once
it ends: see examples/pipeline-host.yaml and examples/trial-guest.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import rota.runtime
from rota.jobkit.tuning.bubbles import BubbleClock, EdgeMarker


def _half(width: int, layers: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods)


MODES = ("alone", "naive", "squeezed")


def free_mb() -> float:
    """The memory stage 0 leaves free for a guest, in MiB: its GPU's free memory, or on the
    CPU (virtual GPU slots) the machine's available memory, which a guest process shares."""
    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0] / 2**20
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _set_mode(clock: BubbleClock, pid: int, step: int) -> str:
    """Interleave the three arms step by step, so that drifting machine load hits them alike."""
    mode = MODES[step % 3]
    clock.watch_pid = pid  # its CPU time inside bubbles counts in every arm (0 while stopped)
    clock.squeeze_pid = pid if mode == "squeezed" else None
    if mode == "naive":
        # An ordinary co-located process: same scheduling class as the stage, always runnable.
        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        os.kill(pid, signal.SIGCONT)
    else:
        # Squeezed (and parked): stopped outside bubbles, and a background process inside them,
        # so a stage thread that wakes at a bubble's end gets the core at once.
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        os.kill(pid, signal.SIGSTOP)
    return mode


def _report_step(clock: BubbleClock, step: int, mode: str, started: float, elapsed: float,
                 windows: list[tuple[float, float, float]]) -> dict[str, object]:
    """Stage 0's measured step: reported to Rota with its bubbles; its row of the timeline."""
    rota.runtime.report(step=step, step_s=elapsed, bubble_s=sum(e - s for s, e, _ in windows),
                        bubble_free_mb=round(free_mb(), 1),
                        bubbles_ms=[[round((s - started) * 1000, 3), round((e - started) * 1000, 3)]
                                    for s, e, _ in windows[:32]])
    return {"mode": mode, "start": started, "end": started + elapsed, "step_s": elapsed,
            "bubble_s": sum(e - s for s, e, _ in windows),
            "bubble_busy_s": sum((e - s) * b for s, e, b in windows)}


def _pause_trials(*pids: int | None) -> None:
    for pid in pids:
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)  # leave the trial paused


def _write_timeline(path: Path, clock: BubbleClock, step_times: list[float], first_measured: float,
                    steps_log: list[dict[str, object]]) -> None:
    out = {"step_s": step_times, "median_step_s": statistics.median(step_times), **clock.summary(),
           "start": first_measured, "compute": clock.compute, "bubbles": [[s, e] for s, e, _ in clock.bubbles],
           "trial_running": clock.resumed, "steps": steps_log,
           "bubble_busy_windows": [b for _, _, b in clock.bubbles]}
    path.write_text(json.dumps(out), encoding="utf-8")


def stage_main(rank: int, args: argparse.Namespace) -> None:
    if args.cores:
        os.sched_setaffinity(0, {args.cores[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=2)
    on_stage0 = rank == 0
    clock = BubbleClock(squeeze_pid=args.squeeze_pid if on_stage0 else None,
                        watch_pid=args.watch_pid if on_stage0 else None)
    module = EdgeMarker(_half(args.width, args.layers, seed=rank), clock)
    stage = PipelineStage(module, stage_index=rank, num_stages=2, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    step_times: list[float] = []
    steps_log: list[dict[str, object]] = []
    first_measured = 0.0
    from_rota = on_stage0 and args.squeeze_pid is None and args.cycle_pid is None
    for step in range(args.warmup + args.steps):
        mode = _set_mode(clock, args.cycle_pid, step) if on_stage0 and args.cycle_pid else "single"
        if from_rota:
            clock.squeeze_pgids = rota.runtime.bubble_guests()
        x = torch.randn(args.batch, args.width, generator=generator)
        y = torch.randn(args.batch, args.width, generator=generator)
        clock.recording = step >= args.warmup
        if step == args.warmup:
            first_measured = clock.clock()
        windows_before = len(clock.bubbles)
        started = clock.clock()
        if on_stage0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        clock.compute_start()
        optimizer.step()
        optimizer.zero_grad()
        clock.compute_end()
        clock.step_boundary()
        elapsed = clock.clock() - started
        if step >= args.warmup:
            step_times.append(elapsed)
            if on_stage0:
                steps_log.append(_report_step(clock, step, mode, started, elapsed, clock.bubbles[windows_before:]))
    _pause_trials(clock.squeeze_pid, args.cycle_pid if on_stage0 else None)
    clock.release()  # the agent's guests run on: they take this job's GPUs over
    dist.barrier()
    if on_stage0 and args.timeline:
        _write_timeline(Path(args.timeline), clock, step_times, first_measured, steps_log)
    dist.destroy_process_group()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="2-stage GPipe job that reports its bubble windows")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=3, help="Linear layers per stage")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--port", type=int, default=29517)
    parser.add_argument("--cores", type=lambda s: [int(c) for c in s.split(",")], default=None,
                        help="stage 0's and stage 1's core, e.g. 0,1")
    parser.add_argument("--squeeze-pid", type=int, default=None, help="a process to run only inside stage 0's bubbles")
    parser.add_argument("--watch-pid", type=int, default=None, help="a co-located process whose CPU time to count")
    parser.add_argument("--cycle-pid", type=int, default=None,
                        help="a co-located trial process: cycle alone / naive / squeezed step by step")
    parser.add_argument("--timeline", default=None, help="write stage 0's windows and step times here (JSON)")
    args = parser.parse_args(argv)
    for name in ("steps", "microbatches", "width", "layers", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name}: must be positive")
    if args.batch % args.microbatches:
        parser.error("--batch: must be a multiple of --microbatches")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=stage_main, args=(rank, args)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
