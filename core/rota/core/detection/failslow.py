"""Fail-slow detection: FLOPs-normalised ratios against a raw-time baseline (pure; docs/design.md §7).

Normalised (`FailSlowDetector`): after a warm-up, each report is explained by the fitted
cost model. A rank's ratio is its busy time over what the model expects for the
micro-batches its replica ran; the job's ratio is the observed iteration time over the
critical path of the 1F1B schedule with the modelled chunk costs. A rank is fail-slow
when its ratio stays above the threshold for k consecutive iterations: a batch of long
sequences raises the expected time as much as the observed one, so only a persistent
slowdown of the device itself keeps the ratio up. When the job's ratio stays high with
no rank to blame (a slow link, a straggling collective), the verdict names the job
(rank −1). Only clean samples (ratio well inside the threshold) refit the model.

Raw (`RawBaseline`): a rank's busy time against the rolling median of its own recent
times, with the same threshold and k; what a detector blind to the workload sees.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rota.core.detection.costmodel import StageFit, features, fit, replica_features
from rota.core.detection.layout import IterationReport, Layout
from rota.core.detection.pipeline import makespan
from rota.core.detection.sequential import Cusum, SequentialConfig
from rota.core.errors import InvalidArgument

JOB = -1  # the rank of a verdict about the job as a whole
OVERHEAD_RATE = 0.05  # how fast the per-step overhead estimate follows clean iterations
SLOW = "slow"
STOP = "stop"
STREAK = "streak"  # k ratios over the threshold in a row
CUSUM = "cusum"  # the sequential test of rota.core.detection.sequential


@dataclass(frozen=True)
class DetectorConfig:
    threshold: float = 1.1  # ratio above which an iteration counts against a rank
    consecutive: int = 5  # k: iterations in a row before a verdict
    warmup: int = 50  # healthy iterations the model is first fitted on
    decay: float = 0.995  # forgetting per sample of the running fit
    window: int = 100  # the raw baseline's rolling median
    mode: str = STREAK  # how the normalised detector decides: STREAK or CUSUM
    common_mode: bool = False  # divide each rank's ratio by the median of all ranks' that iteration
    sequential: SequentialConfig = field(default_factory=SequentialConfig)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold > 1):
            raise InvalidArgument("threshold", f"must be a ratio above 1 (got {self.threshold})")
        if self.consecutive < 1:
            raise InvalidArgument("consecutive", f"must be at least 1 (got {self.consecutive})")
        if self.warmup < 2:
            raise InvalidArgument("warmup", f"must be at least 2 iterations (got {self.warmup})")
        if not 0 < self.decay <= 1:
            raise InvalidArgument("decay", f"must be in (0, 1] (got {self.decay})")
        if self.window < 3:
            raise InvalidArgument("window", f"must be at least 3 (got {self.window})")
        if self.mode not in (STREAK, CUSUM):
            raise InvalidArgument("mode", f"must be {STREAK} or {CUSUM} (got {self.mode!r})")

    @property
    def clean(self) -> float:
        """Ratios up to here are healthy enough to learn from: halfway to the threshold."""
        return 1 + (self.threshold - 1) / 2


# The rule the cluster runs (rota.common.config; ROTA_DETECTOR_MODE / _COMMON_MODE override it):
# the sequential test with common mode. On the real pipeline job's recorded runs it kept
# precision 1.0 where the streak rule, the dataclass's default that the generated benchmark
# tables use, scored 0.41 (13 false alarms per 1,000 iterations), and live it alone did not
# flag every stage when the host's load slowed them all at once (bench/detector/README.md).
CLUSTER_DEFAULT = DetectorConfig(mode=CUSUM, common_mode=True)


@dataclass(frozen=True)
class Verdict:
    rank: int  # JOB for the job as a whole
    kind: str  # SLOW or STOP
    iteration: int
    ratio: float  # slow: mean observed / expected over the k iterations; stop: silence / timeout
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Episodes:
    """Per subject: k iterations over the threshold open an episode (one verdict); k under close it."""

    k: int
    streak: dict[int, int] = field(default_factory=dict)
    calm: dict[int, int] = field(default_factory=dict)
    flagged: set[int] = field(default_factory=set)

    def update(self, subject: int, over: bool) -> bool:
        """Counts one iteration; True exactly when an episode opens now."""
        self.streak[subject] = self.streak.get(subject, 0) + 1 if over else 0
        self.calm[subject] = 0 if over else self.calm.get(subject, 0) + 1
        if subject in self.flagged:
            if self.calm[subject] >= self.k:
                self.flagged.discard(subject)
            return False
        if self.streak[subject] >= self.k:
            self.flagged.add(subject)
            return True
        return False


def _mean(values: Any) -> float:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else 0.0


class FailSlowDetector:
    """One job's normalised fail-slow detector; `observe` each report in iteration order."""

    def __init__(self, layout: Layout, config: DetectorConfig | None = None) -> None:
        self.layout = layout
        self.config = config or DetectorConfig()
        self.fits = [StageFit(decay=self.config.decay) for _ in range(layout.pp)]
        self.overhead = 0.0  # seconds the step takes beyond the pipeline (all-reduce, optimizer)
        self.warm: list[IterationReport] = []
        self.ready = False
        self.ranks = Episodes(self.config.consecutive)
        self.job = Episodes(self.config.consecutive)
        self.recent: dict[int, deque[float]] = {}
        self.recent_job: deque[float | None] = deque(maxlen=self.config.consecutive)
        self.last_ratios: dict[int, float] = {}
        self.last_iteration = -1
        # Reports waiting k iterations before they may refit the model (see `_learn`).
        self.pending: deque[tuple[IterationReport, dict[int, float], float | None]] = deque()
        self.cusums: dict[int, Cusum] = {}  # mode CUSUM: per rank, and JOB for the step

    # Expected times.
    def expected_rank(self, rank: int, report: IterationReport) -> float:
        x = replica_features(report.micro_batches[self.layout.replica(rank)])
        return self.fits[self.layout.stage(rank)].predict(x)

    def pipeline_seconds(self, report: IterationReport) -> float:
        """The modelled critical path: the slowest replica's 1F1B makespan (replicas that reported)."""
        active = {self.layout.replica(r) for r, s in enumerate(report.rank_seconds) if s is not None}
        spans = [
            makespan([[self.fits[s].predict(features(mb)) for mb in report.micro_batches[d]] for s in range(self.layout.pp)])
            for d in sorted(active)
        ]
        return max(spans, default=0.0)

    def expected_iteration(self, report: IterationReport) -> float:
        return self.pipeline_seconds(report) + self.overhead

    # The warm-up fit.
    def _fit_warm(self) -> None:
        """Fits each stage on the ranks that run as fast as their fastest peer.

        A device that is already slow when the job starts would otherwise pull its stage's
        model up and hide itself; peers of one stage do the same work, so the fastest of
        them (within half the threshold's margin) stand for the stage.
        """
        L = self.layout
        samples: dict[int, list[tuple[tuple[float, float], float]]] = {r: [] for r in range(L.ranks)}
        for rep in self.warm:
            for r, y in enumerate(rep.rank_seconds):
                if y is not None:
                    samples[r].append((replica_features(rep.micro_batches[L.replica(r)]), y))
        for s in range(L.pp):
            ranks = [r for r in range(L.ranks) if L.stage(r) == s and samples[r]]
            everyone = fit([x for r in ranks for x in samples[r]])
            level = {r: statistics.median(y / max(everyone.predict(x), 1e-12) for x, y in samples[r]) for r in ranks}
            fastest = min(level.values(), default=1.0)
            kept = [r for r in ranks if level[r] <= fastest * self.config.clean]
            f = StageFit(decay=self.config.decay)
            for r in kept:
                for x, y in samples[r]:
                    f.add(x, y)
            f.solve()
            self.fits[s] = f
        gaps = [rep.iteration_seconds - self.pipeline_seconds(rep) for rep in self.warm if rep.iteration_seconds > 0]
        self.overhead = max(0.0, statistics.median(gaps)) if gaps else 0.0
        if self.config.mode == CUSUM:
            self._calibrate_cusums()
        self.warm = []
        self.ready = True

    def _calibrate_cusums(self) -> None:
        """σ and h of each series from the warm-up's own ratios (its no-fault calibration):
        the ranks share one noise estimate, the step has its own."""
        noise: list[float] = []
        steps: list[float] = []
        for rep in self.warm:
            noise += self._ratios(rep).values()
            expected = self.expected_iteration(rep)
            if rep.iteration_seconds > 0 and expected > 0:
                steps.append(rep.iteration_seconds / expected)
        cfg = self.config.sequential
        series = self.layout.ranks + 1
        self.cusums = {r: Cusum.calibrated(noise, series, cfg) for r in range(self.layout.ranks)}
        self.cusums[JOB] = Cusum.calibrated(steps, series, cfg)

    def _ratios(self, report: IterationReport) -> dict[int, float]:
        """Each reporting rank's busy time over its expected time (over the iteration's
        median of them, with `common_mode`: what slowed every rank at once is not a device's)."""
        ratios: dict[int, float] = {}
        for r, y in enumerate(report.rank_seconds):
            expected = self.expected_rank(r, report) if y is not None else 0.0
            if y is not None and expected > 0:
                ratios[r] = y / expected
        if self.config.common_mode and len(ratios) >= 3:
            common = statistics.median(ratios.values())
            if common > 0:
                ratios = {r: v / common for r, v in ratios.items()}
        return ratios

    # One report.
    def observe(self, report: IterationReport) -> list[Verdict]:
        if report.layout.base() != self.layout.base() or report.layout.stages != self.layout.stages:
            raise InvalidArgument("layout", "differs from the job's earlier reports (a re-planned job starts afresh)")
        if report.iteration <= self.last_iteration:  # a repeat (a retried send) counts once
            return []
        self.last_iteration = report.iteration
        if not self.ready:
            self.warm.append(report)
            if len(self.warm) >= self.config.warmup:
                self._fit_warm()
            return self._against_prediction(report)
        cfg = self.config
        ratios = self._ratios(report)
        self.last_ratios = ratios
        expected_iter = self.expected_iteration(report)
        job_ratio = report.iteration_seconds / expected_iter if report.iteration_seconds > 0 and expected_iter > 0 else None
        self.recent_job.append(job_ratio)
        verdicts: list[Verdict] = []
        sequential = cfg.mode == CUSUM
        for r, ratio in ratios.items():
            self.recent.setdefault(r, deque(maxlen=cfg.consecutive)).append(ratio)
            fired = self.cusums[r].update(ratio) if sequential else self.ranks.update(r, ratio > cfg.threshold)
            if fired:
                verdicts.append(self._rank_verdict(r, report, ratios, expected_iter))
        blamed = any(v > cfg.threshold for v in ratios.values())
        if sequential:
            blamed = any(self.cusums[r].flagged or self.cusums[r].s > 0 for r in ratios)
            job_fired = job_ratio is not None and self.cusums[JOB].update(job_ratio) and not blamed
        else:
            job_fired = job_ratio is not None and self.job.update(JOB, job_ratio > cfg.threshold and not blamed)
        if job_fired:
            verdicts.append(self._job_verdict(report, expected_iter,
                                              "the step is slower than its critical path while no rank's own time explains it"))
        self._learn(report, ratios, job_ratio, expected_iter)
        return verdicts

    def _against_prediction(self, report: IterationReport) -> list[Verdict]:
        """Before the job's own times are learned, its predicted step time (when it sends
        one) is the expectation: k steps in a row over the threshold open a job verdict.
        The warm-up's own steps could not show a slowdown that is there from the start."""
        if report.predicted_seconds <= 0 or report.iteration_seconds <= 0:
            return []
        ratio = report.iteration_seconds / report.predicted_seconds
        self.recent_job.append(ratio)
        if not self.job.update(JOB, ratio > self.config.threshold):
            return []
        return [self._job_verdict(report, report.predicted_seconds,
                                  "the step is slower than the job's predicted step time (before its own times are learned)")]

    def _job_verdict(self, report: IterationReport, expected_iter: float, why: str) -> Verdict:
        """The job as a whole is slow: its last k step ratios against `expected_iter`."""
        return Verdict(JOB, SLOW, report.iteration, _mean(self.recent_job), {
            "iteration_ratios": [round(v, 4) for v in self.recent_job if v is not None],
            "expected_iteration_seconds": round(expected_iter, 6),
            "observed_iteration_seconds": report.iteration_seconds,
            "threshold": self.config.threshold, "consecutive": self.config.consecutive,
            "why": why,
        })

    def _rank_verdict(self, r: int, report: IterationReport, ratios: dict[int, float], expected_iter: float) -> Verdict:
        L, cfg = self.layout, self.config
        s, d = L.stage(r), L.replica(r)
        peers = [p for p in L.group(s, d) if p != r]
        recent = list(self.recent[r])
        return Verdict(r, SLOW, report.iteration, sum(recent) / len(recent), {
            "stage": s, "replica": d, "tp_index": L.tp_index(r),
            "rank_ratios": [round(v, 4) for v in recent],
            "tp_peer_ratios": {str(p): round(ratios[p], 4) for p in peers if p in ratios},
            "iteration_ratios": [round(v, 4) for v in self.recent_job if v is not None],
            "observed_seconds": report.rank_seconds[r],
            "expected_seconds": round(self.expected_rank(r, report), 6),
            "expected_iteration_seconds": round(expected_iter, 6),
            "observed_iteration_seconds": report.iteration_seconds,
            "threshold": cfg.threshold, "consecutive": cfg.consecutive,
        })

    def _suspect(self, r: int) -> bool:
        """Flagged, or its recent median ratio past the clean band."""
        recent = self.recent.get(r)
        flagged = r in self.ranks.flagged or (r in self.cusums and self.cusums[r].flagged)
        return flagged or (recent is not None and statistics.median(recent) > self.config.clean)

    def _learn(self, report: IterationReport, ratios: dict[int, float], job_ratio: float | None, expected_iter: float) -> None:
        """Refits on the report from k iterations ago, judged with hindsight.

        A sample is learned once its rank has had k more iterations to show a slowdown: the
        first slow iterations of a fault are then never learned, and no single sample is
        dropped for being high, which would bias the fit down under noise until noise alone
        tripped it. A suspect rank (by its recent median) teaches nothing meanwhile.
        """
        L = self.layout
        gap = report.iteration_seconds - (expected_iter - self.overhead) if job_ratio is not None else None
        self.pending.append((report, dict(ratios), gap))
        if len(self.pending) <= self.config.consecutive:
            return
        old, old_ratios, old_gap = self.pending.popleft()
        ranks = list(old_ratios)
        suspects = {r for r in ranks if self._suspect(r)}
        if self.config.mode == CUSUM:  # a sample far past any slowdown looked for (a transient) teaches nothing
            far = self.config.sequential.shift ** 2
            suspects |= {r for r, v in old_ratios.items() if v > far}
        touched: set[int] = set()
        for r in ranks:
            y = old.rank_seconds[r]
            if r not in suspects and y is not None:
                self.fits[L.stage(r)].add(replica_features(old.micro_batches[L.replica(r)]), y)
                touched.add(L.stage(r))
        for s in touched:
            self.fits[s].solve()
        recent_job = [v for v in self.recent_job if v is not None]
        if old_gap is not None and not suspects and recent_job and statistics.median(recent_job) <= self.config.clean:
            self.overhead += OVERHEAD_RATE * (max(0.0, old_gap) - self.overhead)


class RawBaseline:
    """Per rank: busy time above the rolling median of its own recent times by the threshold."""

    def __init__(self, layout: Layout, config: DetectorConfig | None = None) -> None:
        self.layout = layout
        self.config = config or DetectorConfig()
        self.history: dict[int, deque[float]] = {}
        self.ranks = Episodes(self.config.consecutive)
        self.seen = 0

    def observe(self, report: IterationReport) -> list[Verdict]:
        cfg = self.config
        self.seen += 1
        verdicts: list[Verdict] = []
        for r, y in enumerate(report.rank_seconds):
            if y is None:
                continue
            window = self.history.setdefault(r, deque(maxlen=cfg.window))
            if self.seen > cfg.warmup and window:
                median = statistics.median(window)
                ratio = y / median if median > 0 else 1.0
                if self.ranks.update(r, ratio > cfg.threshold):
                    verdicts.append(Verdict(r, SLOW, report.iteration, ratio, {
                        "observed_seconds": y, "rolling_median_seconds": median, "threshold": cfg.threshold,
                    }))
            window.append(y)
        return verdicts
