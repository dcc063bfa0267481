"""Saved real runs, rescored: the sequential detector tuned on one seed set and judged on another.

`rota bench detector --real --save DIR` writes one JSON file per run (its lines as read, its
fault windows with the slowdown each really gave); `rota bench detector --replay DIR
[--tune-seeds 0,1]` scores them again without running anything: the normalised detector
as it was (k ratios over 1.1 in a row), the sequential one (CUSUM, with and without the
per-iteration common-mode normalisation), and the raw baseline. With `--tune-seeds`, the
sequential detector's σ scale and window are chosen on those seeds' runs (fewest false
alarms and transient marks, then most faults found, then the earliest) and reported on
the rest only.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rota.bench.detector_real import Recording, achieved
from rota.bench.detector_score import Pool, replay
from rota.bench.detector_workload import Fault
from rota.core.detection.failslow import CUSUM, SLOW, STOP, DetectorConfig, Verdict
from rota.core.detection.sequential import SequentialConfig

BEAT_S = 0.5
SIGMA_SCALES = (1.0, 1.25, 1.5, 2.0)
WINDOWS = (5, 9, 13)


@dataclass(frozen=True)
class SavedRun:
    name: str
    seed: int
    lines: list[tuple[float, dict[str, Any]]]
    windows: list[dict[str, Any]]  # kind, rank, factor, start, end, achieved, quotas
    load: tuple[float, float]  # 1-minute load average at its start and end


def save(path: Path, name: str, seed: int, lines: list[tuple[float, dict[str, Any]]],
         windows: list[dict[str, Any]], load: tuple[float, float]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name.replace(' ', '_')}-seed{seed}.json").write_text(json.dumps(
        {"name": name, "seed": seed, "windows": windows, "load": list(load), "lines": lines}))


def load(path: Path) -> list[SavedRun]:
    """The runs saved under `path` and its folders (``*.json``, or gzipped ``*.json.gz``)."""
    out = []
    for f in sorted([*path.rglob("*.json"), *path.rglob("*.json.gz")]):
        d = json.loads(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_text())
        out.append(SavedRun(d["name"], int(d["seed"]), [(float(t), line) for t, line in d["lines"]],
                            d["windows"], (float(d["load"][0]), float(d["load"][1]))))
    return out


def faults_of(run: SavedRun) -> list[Fault]:
    """The faults a verdict may rightly name: slow and stop windows (a transient names none)."""
    out = []
    for w in run.windows:
        if w["kind"] in ("slow", STOP) and w.get("start") is not None:
            out.append(Fault(SLOW if w["kind"] == "slow" else STOP, int(w["rank"]), int(w["start"]), w.get("end"),
                             float(w.get("factor", 1.0))))
    return out


def transient_marks(verdicts: Iterable[Verdict], run: SavedRun) -> int:
    """Slow verdicts on a transient's rank from its start until the next fault's (or the end)."""
    marks = 0
    starts = sorted(int(w["start"]) for w in run.windows if w.get("start") is not None)
    for w in run.windows:
        if w["kind"] != "transient" or w.get("start") is None:
            continue
        later = [s for s in starts if s > int(w["start"])]
        until = later[0] if later else 1 << 30
        marks += sum(1 for v in verdicts if v.rank == int(w["rank"]) and v.kind == SLOW and int(w["start"]) <= v.iteration < until)
    return marks


def detectors(sequential: SequentialConfig) -> dict[str, DetectorConfig]:
    return {
        "streak": DetectorConfig(),
        "cusum": DetectorConfig(mode=CUSUM, sequential=sequential),
        "cusum+common": DetectorConfig(mode=CUSUM, common_mode=True, sequential=sequential),
    }


def score(runs: list[SavedRun], sequential: SequentialConfig) -> dict[str, Any]:
    """Per detector: pooled scores, transient marks; "raw" is the raw-time baseline."""
    pools: dict[str, Pool] = {}
    marks: dict[str, int] = {}
    for name, config in detectors(sequential).items():
        for run in runs:
            normalized, raw, seen = replay(run.lines, config, BEAT_S)
            pools.setdefault(name, Pool()).add(normalized, faults_of(run), seen, config.consecutive)
            marks[name] = marks.get(name, 0) + transient_marks(normalized, run)
            if name == "streak":
                pools.setdefault("raw", Pool()).add(raw, faults_of(run), seen, config.consecutive)
                marks["raw"] = marks.get("raw", 0) + transient_marks(raw, run)
    return {name: {**pool.scores(), "transient_marked_bad": marks[name]} for name, pool in pools.items()}


def tune(runs: list[SavedRun]) -> tuple[SequentialConfig, list[dict[str, Any]]]:
    """The σ scale and window with the fewest false alarms and transient marks, then the
    most faults found, then the shortest delay, on `runs` (the cusum+common detector)."""
    table = []
    for scale in SIGMA_SCALES:
        for window in WINDOWS:
            cfg = dataclasses.replace(SequentialConfig(), sigma_scale=scale, window=window)
            s = score(runs, cfg)["cusum+common"]
            table.append({"sigma_scale": scale, "window": window, **s})
    best = min(table, key=lambda r: (r["false_alarms"] + r["transient_marked_bad"], -r["detected"],
                                     r["mean_delay_iters"] if r["mean_delay_iters"] is not None else 1e9))
    return dataclasses.replace(SequentialConfig(), sigma_scale=best["sigma_scale"], window=best["window"]), table


def evaluate(path: Path, tune_seeds: set[int] | None) -> dict[str, Any]:
    runs = load(path)
    if not runs:
        raise FileNotFoundError(f"no saved runs under {path}")
    chosen, table = SequentialConfig(), list[dict[str, Any]]()
    held = runs
    if tune_seeds:
        chosen, table = tune([r for r in runs if r.seed in tune_seeds])
        held = [r for r in runs if r.seed not in tune_seeds]
    by_kind: dict[str, list[SavedRun]] = {}
    for r in held:
        by_kind.setdefault(r.name, []).append(r)
    return {
        "runs": len(held), "tuned_on_seeds": sorted(tune_seeds or ()), "held_out_seeds": sorted({r.seed for r in held}),
        "sequential": dataclasses.asdict(chosen), "tuning": table,
        "all": score(held, chosen), "cases": {k: score(v, chosen) for k, v in by_kind.items()},
        "achieved": [{"run": r.name, "seed": r.seed, "kind": w["kind"], "factor": w.get("factor"),
                      "achieved": w.get("achieved"), "achieved_settled": settled(r, w), "load": r.load}
                     for r in held for w in r.windows if w["kind"] in ("slow", "transient")],
    }


def settled(run: SavedRun, window: dict[str, Any], settle: int = 9) -> float | None:
    """A slow window's achieved slowdown from `settle` iterations after its start (once settled)."""
    if window["kind"] != "slow" or window.get("start") is None:
        return None
    rec = Recording(lines=run.lines, start=int(window["start"]), end=window.get("end"))
    return achieved(rec, int(window["rank"]), settle=settle)


def print_eval(result: dict[str, Any]) -> None:
    if result["tuning"]:
        print(f"tuned on seeds {result['tuned_on_seeds']}: sigma_scale {result['sequential']['sigma_scale']}, "
              f"window {result['sequential']['window']}; held-out seeds {result['held_out_seeds']} ({result['runs']} runs)")
    print(f"{'runs':<22} {'detector':<13} {'precision':>9} {'recall':>7} {'false/1k':>9} {'delay':>7} {'transient':>9}")
    for name, rows in [*result["cases"].items(), ("all", result["all"])]:
        for det, r in rows.items():
            delay = "-" if r["mean_delay_iters"] is None else f"{r['mean_delay_iters']:.1f}"
            print(f"{name:<22} {det:<13} {r['precision']:>9.3f} {r['recall']:>7.3f} {r['false_alarms_per_1k']:>9.2f} "
                  f"{delay:>7} {r['transient_marked_bad']:>9}")
    for a in result["achieved"]:
        got = "-" if a["achieved"] is None else f"{a['achieved']:.2f}x"
        later = "" if a.get("achieved_settled") is None else f", {a['achieved_settled']:.2f}x from 9 iterations in"
        print(f"  {a['run']} seed {a['seed']}: {a['kind']} intended {a['factor']}x, achieved {got}{later} "
              f"(load {a['load'][0]:.1f}-{a['load'][1]:.1f})")
