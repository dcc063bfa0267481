"""Replay a recorded real run through the detectors, and score verdicts pooled over runs (pure).

A run is its lines as the agent read them: iteration reports (each also a heartbeat of the
ranks whose times it carries) and per-stage heartbeats, each stamped with its read time.
Both detectors see the same reports and the same heartbeat monitor (silent for three
beat intervals = stopped, named at the iteration in progress). A verdict is correct when
it names the faulty rank with the fault's kind while the fault is active (or within k
iterations of its end); everything else is a false alarm.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rota.bench.detector_workload import Fault
from rota.core.detection.failslow import JOB, STOP, DetectorConfig, FailSlowDetector, RawBaseline, Verdict
from rota.core.detection.failstop import HeartbeatMonitor
from rota.core.detection.layout import IterationReport, Layout


def report_of(line: dict[str, Any]) -> IterationReport:
    """The detector's report from a `rota.runtime.report_iteration` line."""
    lay = line["layout"]
    layout = Layout(int(lay["tp"]), int(lay["pp"]), int(lay["dp"]), tuple(lay.get("stages", ())))
    micro = tuple(tuple(tuple(int(n) for n in mb) for mb in mbs) for mbs in line["micro_batches"])
    return IterationReport(int(line["iteration"]), layout, tuple(line["rank_seconds"]), micro,
                           float(line.get("iteration_seconds", 0.0)))


def replay(lines: Sequence[tuple[float, dict[str, Any]]], config: DetectorConfig,
           beat_s: float) -> tuple[list[Verdict], list[Verdict], int]:
    """(normalised verdicts, raw verdicts, iterations seen) of one recorded run.

    Silence is judged at each line's time, so a rank is declared stopped only while others
    still beat: the run's end (every stage stops beating together) is no stop."""
    normalized: FailSlowDetector | None = None
    raw: RawBaseline | None = None
    monitor = HeartbeatMonitor(default_interval_s=beat_s)
    out_n: list[Verdict] = []
    out_r: list[Verdict] = []
    last = -1
    for at, line in lines:
        if "beat" in line:
            for rank in line["beat"]:
                monitor.beat(int(rank), at)
        elif "iteration" in line:
            report = report_of(line)
            if normalized is None or raw is None:
                normalized, raw = FailSlowDetector(report.layout, config), RawBaseline(report.layout, config)
            for rank, s in enumerate(report.rank_seconds):
                if s is not None:
                    monitor.beat(rank, at)
            out_n += normalized.observe(report)
            out_r += raw.observe(report)
            last = report.iteration
        stops = _stops(monitor, at, last)
        out_n += stops
        out_r += stops
    return out_n, out_r, last + 1


def _stops(monitor: HeartbeatMonitor, now: float, last: int) -> list[Verdict]:
    return [Verdict(int(s.source), STOP, last + 1, s.silent_s / s.timeout_s,  # type: ignore[call-overload]
                    {"silent_s": s.silent_s, "timeout_s": s.timeout_s}) for s in monitor.expired(now)]


def _correct(v: Verdict, faults: Iterable[Fault], grace: int) -> Fault | None:
    for f in faults:
        end = f.end + grace if f.end is not None else None
        if v.rank == f.rank and v.kind == f.kind and f.start <= v.iteration and (end is None or v.iteration < end):
            return f
    return None


@dataclass
class Pool:
    """Counts pooled over runs (each with its own faults and length)."""

    right: int = 0
    wrong: int = 0
    faults: int = 0
    detected: int = 0
    iterations: int = 0
    job_level: int = 0  # false alarms naming the job (rank -1): judged on the step's wall time
    delays: list[int] = field(default_factory=list)

    def add(self, verdicts: Sequence[Verdict], faults: Sequence[Fault], iterations: int, grace: int) -> None:
        first: dict[Fault, int] = {}
        for v in verdicts:
            f = _correct(v, faults, grace)
            if f is None:
                self.wrong += 1
                self.job_level += v.rank == JOB
            else:
                self.right += 1
                first.setdefault(f, v.iteration)
        self.faults += len(faults)
        self.detected += len(first)
        self.iterations += iterations
        self.delays += [it - f.start for f, it in first.items()]

    def scores(self) -> dict[str, Any]:
        total = self.right + self.wrong
        return {
            "precision": round(self.right / total, 4) if total else 1.0,
            "recall": round(self.detected / self.faults, 4) if self.faults else 1.0,
            "false_alarms_per_1k": round(1000 * self.wrong / self.iterations, 3) if self.iterations else 0.0,
            "mean_delay_iters": round(statistics.mean(self.delays), 2) if self.delays else None,
            "faults": self.faults, "detected": self.detected, "false_alarms": self.wrong,
            "job_level_false_alarms": self.job_level,
            "iterations": self.iterations,
        }
