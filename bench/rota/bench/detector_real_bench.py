"""The `--real` part of `rota bench detector`: fault runs of the real pipeline job, scored, and the re-plan.

For each seed: one run with no fault, one per slowdown factor (1.2x, 1.5x from iteration
`FAULT_AT` to the end), a transient 1.5x throttle of `TRANSIENT` iterations (fewer than the
detector's k) and a killed stage; the faulty rank is seed mod 4. Scores pool the runs per
fault kind and over all of them, for the normalised detector and the raw-time baseline.

The loop on a real job, at the benchmark level (no cluster: `rota replan JOB --apply`
restarts a job the same way, from its checkpoint with ROTA_LAYOUT): a 16-layer job is
throttled 1.5x on one stage; its rate before the fault and while slow come from that run;
the normalised verdict's ratio becomes the stage's speed, `rota.core.detection.replan`
moves layers off it, and the job is restarted with that split and the stage still
throttled, for the rate after.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rota.bench.detector_real import BEAT_S, STAGES, RealFault, Recording, calibrate, run_job
from rota.bench.detector_score import Pool, replay
from rota.bench.detector_workload import Fault
from rota.core.detection.failslow import SLOW, STOP, DetectorConfig, Verdict
from rota.core.detection.layout import Layout
from rota.core.detection.replan import replan

FACTORS = (1.2, 1.5)
ITERATIONS = 110
FAULT_AT = 75  # 25 judged iterations after the 50-iteration warm-up, then 35 under the fault
TRANSIENT = 3  # iterations; the detector needs k = 5 in a row
REPLAN_LAYERS = "4,4,4,4"
REPLAN_ITERATIONS = (100, 50)  # the throttled run (fault at FAULT_AT - 15), the re-planned one


def cases(seed: int) -> list[tuple[str, RealFault]]:
    rank = seed % STAGES
    out = [("none", RealFault("none"))]
    out += [(f"slow {f}x", RealFault("slow", rank, FAULT_AT, f)) for f in FACTORS]
    out += [(f"transient {FACTORS[-1]}x", RealFault("transient", rank, FAULT_AT, FACTORS[-1], TRANSIENT)),
            ("stop", RealFault("stop", rank, FAULT_AT))]
    return out


def truth(fault: RealFault, rec: Recording) -> list[Fault]:
    """The faults a verdict may rightly name (a transient must name none)."""
    if fault.kind in ("none", "transient") or rec.start is None:
        return []
    return [Fault(SLOW if fault.kind == "slow" else STOP, fault.rank, rec.start, None, fault.factor)]


def _marked_bad(verdicts: list[Verdict], fault: RealFault) -> int:
    return sum(1 for v in verdicts if v.rank == fault.rank and v.kind == SLOW)


def rate(rec: Recording, first: int, last: int) -> float:
    """Iterations per second between the reports of iterations `first` and `last` (read times)."""
    at = {int(line["iteration"]): t for t, line in rec.lines if "iteration" in line}
    last = min(last, max(at))
    return (last - first) / (at[last] - at[first]) if last > first and at[last] > at[first] else 0.0


def _seed_runs(seed: int, config: DetectorConfig, fractions: dict[str, float],
               log: Callable[[str], None]) -> list[tuple[str, RealFault, Recording]]:
    out = []
    for name, fault in cases(seed):
        rec = run_job(fault, seed=seed, iterations=ITERATIONS, fraction=fractions.get(str(fault.factor), 1.0))
        verdicts_n, verdicts_r, _ = replay(rec.lines, config, BEAT_S)
        log(f"seed {seed} {name:<16} rank {fault.rank} from {rec.start}: normalised "
            f"{[(v.rank, v.kind, v.iteration, round(v.ratio, 2)) for v in verdicts_n]}; raw "
            f"{[(v.rank, v.kind, v.iteration) for v in verdicts_r]}")
        out.append((name, fault, rec))
    return out


def score_runs(done: list[tuple[str, RealFault, Recording]], config: DetectorConfig) -> dict[str, Any]:
    pools: dict[str, dict[str, Pool]] = {}
    transient_bad = 0
    for name, fault, rec in done:
        verdicts_n, verdicts_r, seen = replay(rec.lines, config, BEAT_S)
        faults = truth(fault, rec)
        for kind, verdicts in (("normalized", verdicts_n), ("raw", verdicts_r)):
            for key in (name, "all"):
                pools.setdefault(key, {}).setdefault(kind, Pool()).add(verdicts, faults, seen, config.consecutive)
        if fault.kind == "transient":
            transient_bad += _marked_bad(verdicts_n, fault)
    return {"cases": {k: {d: p.scores() for d, p in v.items()} for k, v in pools.items() if k != "all"},
            "all": {d: p.scores() for d, p in pools["all"].items()}, "transient_marked_bad": transient_bad}


def run_replan(config: DetectorConfig, fraction: float, log: Callable[[str], None]) -> dict[str, Any]:
    at = FAULT_AT - 15
    layers = [int(n) for n in REPLAN_LAYERS.split(",")]
    rank = 1
    slow = run_job(RealFault("slow", rank, at, FACTORS[-1]), seed=0, iterations=REPLAN_ITERATIONS[0],
                   fraction=fraction, layers=REPLAN_LAYERS)
    verdicts, _, seen = replay(slow.lines, config, BEAT_S)
    found = next((v for v in verdicts if v.rank == rank and v.kind == SLOW), None)
    start = slow.start or at
    before, during = rate(slow, 10, start - 1), rate(slow, start + 5, seen - 1)
    if found is None:
        log("re-plan: the slow stage was not flagged; no re-plan")
        return {"before_it_s": round(before, 3), "slow_it_s": round(during, 3), "after_it_s": None}
    speeds = [1.0] * STAGES
    speeds[rank] = 1 / found.ratio
    plan = replan(Layout(1, STAGES, 1), speeds, layers=sum(layers), microbatches=4)
    split = ",".join(str(n) for n in plan.layers_per_stage)
    after_run = run_job(RealFault("slow", rank, 1, FACTORS[-1]), seed=0, iterations=REPLAN_ITERATIONS[1],
                        fraction=fraction, layers=split)
    after = rate(after_run, 10, REPLAN_ITERATIONS[1] - 1)
    log(f"re-plan: rank {rank} flagged at {found.iteration} (ratio {found.ratio:.2f}); layers {REPLAN_LAYERS} -> {split}; "
        f"{before:.3f} it/s before, {during:.3f} slow, {after:.3f} after")
    lost = before - during
    return {"before_it_s": round(before, 3), "slow_it_s": round(during, 3), "after_it_s": round(after, 3),
            "recovered_share": round((after - during) / lost, 3) if lost > 0 else None,
            "flagged_at": found.iteration, "ratio": round(found.ratio, 3), "layers_before": layers,
            "layers_after": plan.layers_per_stage, "modelled_throughput": {
                "as_is": round(plan.throughput_before, 3), "replanned": round(plan.throughput_after, 3)}}


def run_real(runs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Calibration first; then the re-plan loop and every seed's runs side by side (each
    seed's faults in turn): on 2 cores a run takes minutes, mostly the stages' start-up."""
    config = DetectorConfig()
    cal = calibrate(FACTORS, log=log)
    fractions = cal["fractions"]
    with ThreadPoolExecutor(max_workers=runs + 1) as pool:
        replanned = pool.submit(run_replan, config, fractions[str(FACTORS[-1])], log)
        seeds = [pool.submit(_seed_runs, seed, config, fractions, log) for seed in range(runs)]
        detection = score_runs([run for s in seeds for run in s.result()], config)
        plan = replanned.result()
    return {"runs": runs, **detection["all"], "replan": plan, "cases": detection["cases"],
            "transient_marked_bad": detection["transient_marked_bad"], "calibration": cal,
            "detector": {"threshold": config.threshold, "consecutive": config.consecutive, "warmup": config.warmup}}


def print_real(real: dict[str, Any]) -> None:
    print(f"real pipeline job, {real['runs']} seed(s) per fault; calibration "
          + ", ".join(f"{c['fraction']:.2f} CPU -> {c['slowdown']:.2f}x" for c in real["calibration"]["measured"]))
    print(f"{'fault':<16} {'detector':<11} {'precision':>9} {'recall':>7} {'false/1k':>9} {'delay':>7}")
    for name, row in [*real["cases"].items(), ("all", {k: real[k] for k in ("normalized", "raw")})]:
        for kind in ("normalized", "raw"):
            r = row[kind]
            delay = "-" if r["mean_delay_iters"] is None else f"{r['mean_delay_iters']:.1f}"
            print(f"{name:<16} {kind:<11} {r['precision']:>9.4f} {r['recall']:>7.4f} "
                  f"{r['false_alarms_per_1k']:>9.3f} {delay:>7}")
    print(f"transient throttles that marked the device bad (normalised): {real['transient_marked_bad']}")
    p = real["replan"]
    print(f"re-plan: {p['before_it_s']} it/s before the fault, {p['slow_it_s']} while slow, {p['after_it_s']} after "
          f"(layers {p.get('layers_before')} -> {p.get('layers_after')}, recovered {p.get('recovered_share')} of the loss)")
