"""The BLOOM-176B slow-GPU incident, replayed through the fail-slow detector as a job-level series.

    python -m rota.bench.bloom_replay [--json]

The chronicles publish the step time of a few iterations (`bench/detector/bloom176b.json`):
healthy windows (iteration 12695, a loss spike at 31214–31222, 31250–31251, 42780–42781)
and the drop at 42782–42784, still there at 45000 (the GPU was found later, by restarting
with different node exclusions). There are no per-rank times, so each report carries the
step time only (one rank, time unknown): the detector can only say the job is slow
(rank −1), not which of the 384 GPUs. Warm-up: the first `WARMUP` healthy points; the
rest of them are judged (false alarms). Two replays: the published points only, and the
published points with the step held at its last published slow value up to iteration
45000, as the chronicle says it "remained there" (an assumption, said as such).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rota.core.detection.failslow import DetectorConfig, FailSlowDetector
from rota.core.detection.layout import IterationReport, Layout

DATA = Path(__file__).resolve().parents[2] / "detector" / "bloom176b.json"
WARMUP = 10
THRESHOLDS = (1.1, 1.05, 1.04, 1.03)
LAYOUT = Layout(1, 1, 1)


def series(data: dict[str, Any], held: bool) -> list[tuple[int, float]]:
    points = [tuple(p) for p in data["healthy"] + data["incident"]]
    if held:
        last_it, last_s = data["incident"][-2]
        points = [p for p in points if p[0] <= last_it]
        points += [(it, last_s) for it in range(last_it + 1, data["found_after"] + 1)]
    return [(int(it), float(s)) for it, s in points]


def replay(points: list[tuple[int, float]], threshold: float, first_slow: int) -> dict[str, Any]:
    detector = FailSlowDetector(LAYOUT, DetectorConfig(threshold=threshold, warmup=WARMUP))
    false_alarms, alarm = 0, None
    for it, seconds in points:
        verdicts = detector.observe(IterationReport(it, LAYOUT, (None,), (((1,),),), seconds))
        if verdicts and it < first_slow:
            false_alarms += len(verdicts)
        elif verdicts and alarm is None:
            alarm = it
    return {"threshold": threshold, "false_alarms": false_alarms, "alarm_at": alarm,
            "healthy_level_s": round(detector.overhead, 2)}


def run() -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    first_slow = data["incident"][1][0]  # 42783: the first step past 110 s
    out: dict[str, Any] = {"source": data["source"], "found_after": data["found_after"], "first_slow": first_slow}
    for name, held in (("published", False), ("held", True)):
        out[name] = [replay(series(data, held), th, first_slow) for th in THRESHOLDS]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rota.bench.bloom_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run()
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"first slow step at iteration {result['first_slow']}; the GPU was found after iteration {result['found_after']}")
    print(f"{'series':<10} {'threshold':>9} {'false alarms':>12} {'alarm at':>9}")
    for name in ("published", "held"):
        for r in result[name]:
            print(f"{name:<10} {r['threshold']:>9.2f} {r['false_alarms']:>12} {str(r['alarm_at'] or '-'):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
