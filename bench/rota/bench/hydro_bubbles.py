"""Hydro bench, bubbles section: a fused trial process co-located with pipeline stage 0 on one core.

Arms, on the same job (examples/pipeline_bubbles.py: 2 stages, gloo, GPipe, stage 0 on core
0 and stage 1 on core 1), interleaved step by step in one run so that the machine's drifting
load (other users of its 2 cores) falls on all three alike:

- alone: the trial process exists but is stopped;
- naive: the trial runs all the time on stage 0's core (the OS shares the core);
- squeezed: stage 0 resumes the trial at a compute end and stops it at the next compute
  start (SIGCONT / SIGSTOP) for the windows predicted long enough, so it runs only inside
  bubbles; the trial also runs at SCHED_IDLE, so a stage thread waking inside a bubble
  preempts it at once.

The trial (4 fused TinyLM trials at S = 8) stamps each finished step into shared memory; its
throughput inside the job's measured window, against its throughput alone on the core, is its
share. The busy fraction of core 0 inside bubble windows (the CPU's stand-in for SM
activity) comes from the stage's and the trial's CPU time inside the windows (see
rota.jobkit.tuning.bubbles).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
JOB = REPO / "examples" / "pipeline_bubbles.py"
RING = 200_000


def _trial_worker(core: int, stamps: Any, count: Any) -> None:
    """Train 4 fused surrogate trials forever, stamping each finished step (CLOCK_MONOTONIC)."""
    import warnings

    import torch

    from rota.jobkit.tuning.fused import FusedTrials, TrialHparams
    from rota.jobkit.tuning.lm import TinyLM, stdlib_batches
    from rota.jobkit.tuning.scaling import scale_width

    warnings.filterwarnings("ignore")
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    base = TinyLM(width=64, layers=2, heads=2, context=32)
    fused = FusedTrials([scale_width(base, 8, seed=i) for i in range(4)], [TrialHparams(lr=1e-2 * (i + 1)) for i in range(4)])
    data = stdlib_batches(seed=0, batch=8, context=32, max_bytes=300_000)
    while True:
        fused.step(data.next())
        with count.get_lock():
            stamps[count.value % RING] = time.perf_counter()
            count.value += 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rate(stamps: Any, count: Any, start: float, end: float) -> float:
    n = count.value
    inside = sum(1 for i in range(max(0, n - RING), n) if start <= stamps[i % RING] <= end)
    return inside / (end - start)


def _run_job(steps: int, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rota-bubbles-") as tmp:
        timeline = Path(tmp) / "timeline.json"
        cmd = [sys.executable, "-W", "ignore", str(JOB), "--steps", str(steps), "--cores", "0,1",
               "--port", str(_free_port()), "--timeline", str(timeline), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "ROTA_PROGRESS_FILE": ""})
        if done.returncode != 0 or not timeline.exists():
            raise RuntimeError(f"pipeline job failed ({done.returncode}): {done.stderr[-2000:]}")
        data: dict[str, Any] = json.loads(timeline.read_text(encoding="utf-8"))
    data["end"] = data["start"] + sum(data["step_s"])
    return data


def _arm(steps: list[dict[str, Any]], mode: str, stamps: Any, count: Any, exclusive: float) -> dict[str, Any]:
    mine = [st for st in steps if st["mode"] == mode]
    n = count.value
    finished = [stamps[i % RING] for i in range(max(0, n - RING), n)]
    inside = sum(1 for t in finished for st in mine if st["start"] <= t <= st["end"])
    bubble = sum(st["bubble_s"] for st in mine)
    return {"step_s": statistics.median(st["step_s"] for st in mine),
            "trial_share": inside / sum(st["step_s"] for st in mine) / exclusive,
            "bubble_busy": sum(st["bubble_busy_s"] for st in mine) / bubble if bubble > 0 else None,
            "bubble_s": bubble, "steps": len(mine)}


def run_bubbles(quick: bool = False) -> dict[str, Any]:
    """The three arms, interleaved step by step in one run of the job (alone, naive, squeezed, alone, ...)."""
    if len(os.sched_getaffinity(0)) < 2:
        raise RuntimeError("the bubbles section needs 2 cores (one per stage)")
    per_arm = 8 if quick else 20
    ctx = mp.get_context("spawn")
    stamps = ctx.Array("d", RING, lock=False)
    count = ctx.Value("l", 0)
    trial = ctx.Process(target=_trial_worker, args=(0, stamps, count), daemon=True)
    trial.start()
    assert trial.pid is not None
    try:
        deadline = time.monotonic() + 300
        while count.value < 3:  # imported, built, warmed up
            if not trial.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the trial process did not start")
            time.sleep(0.1)
        started = time.perf_counter()
        time.sleep(2.0 if quick else 4.0)
        exclusive = _rate(stamps, count, started, time.perf_counter())
        os.kill(trial.pid, signal.SIGSTOP)
        run = _run_job(3 * per_arm, ["--cycle-pid", str(trial.pid), "--warmup", "3"])
    finally:
        trial.kill()
        trial.join(timeout=10)
    arms = {mode: _arm(run["steps"], mode, stamps, count, exclusive) for mode in ("alone", "naive", "squeezed")}
    alone = arms["alone"]
    squeezed_steps = [st for st in run["steps"] if st["mode"] == "squeezed"][:2]
    shown = [(st["start"], st["end"]) for st in squeezed_steps]

    def placed(interval: list[float]) -> list[float] | None:
        # Squeezed steps alternate with the other arms' steps: lay the shown ones end to end.
        offset = 0.0
        for s, e in shown:
            if s <= interval[0] <= e:
                return [interval[0] - s + offset, interval[1] - s + offset]
            offset += e - s
        return None

    def lay(intervals: list[list[float]]) -> list[list[float]]:
        return [p for p in (placed(i) for i in intervals) if p is not None]

    return {
        "alone_step_s": alone["step_s"],
        "naive": {k: arms["naive"][k] for k in ("step_s", "trial_share", "bubble_busy")},
        "squeezed": {k: arms["squeezed"][k] for k in ("step_s", "trial_share", "bubble_busy")},
        "alone_bubble_busy": alone["bubble_busy"],
        "bubble_share_of_step": alone["bubble_s"] / (alone["step_s"] * alone["steps"]),
        "trial_exclusive_steps_per_s": exclusive,
        "steps_per_arm": per_arm,
        "busy_measure": "core busy fraction inside bubble windows (CPU stand-in for SM activity): "
                        "CPU time of stage 0 and the trial inside the windows / window length",
        "timeline": {"start": 0.0, "compute": lay(run["compute"]), "bubbles": lay(run["bubbles"]),
                     "trial_running": lay(run["trial_running"])},
    }
