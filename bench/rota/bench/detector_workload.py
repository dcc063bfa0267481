"""Synthetic training iterations for `rota bench detector` (pure; seeded, reproducible).

Each iteration, every data-parallel replica packs long-tailed sequence lengths (lognormal
around `median`, clipped at `max`) into micro-batches of `tokens_per_microbatch` tokens
(a sequence longer than that fills one alone). A micro-batch costs α·tokens + β·Σ lᵢ² on
a stage (β puts attention's cost level with the rest at CROSSOVER tokens; the last stage
carries the LM head). A rank's busy time is the sum over its replica's micro-batches of
its own cost times noise (and, rarely, a one-off hiccup); a TP group runs each micro-batch
at its slowest member; the step takes the slowest replica's 1F1B makespan plus an
all-reduce. Faults: `slow` multiplies a rank's costs by `factor` from `from_iter` (until
`to_iter`, if given); `stop` silences a rank from `at_iter` on, and its replica drops out
of the step (the job runs on with the others, as elastic data parallelism would).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rota.core.detection.failslow import SLOW, STOP, DetectorConfig
from rota.core.detection.layout import IterationReport, Layout, MicroBatch
from rota.core.detection.pipeline import makespan
from rota.core.errors import InvalidArgument

MICROBATCH_SECONDS = 0.06  # F+B+W of a full micro-batch of short sequences on one stage
CROSSOVER = 8192  # tokens at which attention costs as much as the per-token work
LM_HEAD = 1.15  # the last stage's extra cost
STAGE_SPREAD = 0.1  # stages differ by up to ±10% (uneven layer costs)
ALLREDUCE_SECONDS = 0.1


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    start: int
    end: int | None = None  # exclusive; None = to the end
    factor: float = 1.0

    def active(self, iteration: int) -> bool:
        return self.start <= iteration and (self.end is None or iteration < self.end)


@dataclass(frozen=True)
class BenchConfig:
    seed: int
    iterations: int
    layout: Layout
    microbatches: int
    seq_median: float
    seq_sigma: float
    seq_max: int
    tokens_per_microbatch: int
    noise: float
    faults: tuple[Fault, ...]
    trials: int = 1
    hiccup_rate: float = 0.002
    heartbeat_interval_s: float = 1.0
    layers: int = 32
    detector: DetectorConfig = DetectorConfig()


def _get(data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    name = f"{where}{key}"
    if key not in data:
        raise InvalidArgument(name, "is required")
    value = data[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgument(name, f"must be a {kind.__name__} (got {value!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(name, "must be finite")
    return value


def parse_config(data: Any) -> BenchConfig:
    """The issue's JSON shape; `trials`, `hiccup_rate`, `heartbeat_interval_s`, `layers` and
    `detector` ({threshold, consecutive, warmup, decay, window}) are optional."""
    if not isinstance(data, dict):
        raise InvalidArgument("config", "must be a JSON object")
    lay = _get(data, "layout", dict)
    layout = Layout(_get(lay, "tp", int, "layout."), _get(lay, "pp", int, "layout."), _get(lay, "dp", int, "layout."))
    seq = _get(data, "seq_len", dict)
    cfg = BenchConfig(
        seed=_get(data, "seed", int), iterations=_get(data, "iterations", int), layout=layout,
        microbatches=_get(data, "microbatches", int), seq_median=_get(seq, "median", float, "seq_len."),
        seq_sigma=_get(seq, "sigma", float, "seq_len."), seq_max=_get(seq, "max", int, "seq_len."),
        tokens_per_microbatch=_get(data, "tokens_per_microbatch", int), noise=_get(data, "noise", float),
        faults=tuple(_fault(f, i, layout) for i, f in enumerate(_get(data, "faults", list))),
        trials=int(data.get("trials", 1)), hiccup_rate=float(data.get("hiccup_rate", 0.002)),
        heartbeat_interval_s=float(data.get("heartbeat_interval_s", 1.0)), layers=int(data.get("layers", 32)),
        detector=DetectorConfig(**data.get("detector", {})),
    )
    checks = [
        ("iterations", cfg.iterations >= 1), ("microbatches", cfg.microbatches >= 1),
        ("seq_len.median", cfg.seq_median >= 1), ("seq_len.sigma", cfg.seq_sigma >= 0),
        ("seq_len.max", cfg.seq_max >= cfg.seq_median), ("tokens_per_microbatch", cfg.tokens_per_microbatch >= 1),
        ("noise", 0 <= cfg.noise < 1), ("trials", 1 <= cfg.trials <= 1000), ("hiccup_rate", 0 <= cfg.hiccup_rate < 1),
        ("heartbeat_interval_s", cfg.heartbeat_interval_s > 0), ("layers", cfg.layers >= layout.pp),
    ]
    for name, ok in checks:
        if not ok:
            raise InvalidArgument(name, "out of range")
    return cfg


def _fault(data: Any, i: int, layout: Layout) -> Fault:
    where = f"faults[{i}]."
    if not isinstance(data, dict):
        raise InvalidArgument(f"faults[{i}]", "must be an object")
    kind = _get(data, "kind", str, where)
    rank = _get(data, "rank", int, where)
    if not 0 <= rank < layout.ranks:
        raise InvalidArgument(f"{where}rank", f"must be in 0..{layout.ranks - 1} (got {rank})")
    if kind == SLOW:
        factor = _get(data, "factor", float, where)
        if not factor > 1:
            raise InvalidArgument(f"{where}factor", f"must be above 1 (got {factor})")
        end = data.get("to_iter")
        return Fault(SLOW, rank, _get(data, "from_iter", int, where), int(end) if end is not None else None, factor)
    if kind == STOP:
        return Fault(STOP, rank, _get(data, "at_iter", int, where))
    raise InvalidArgument(f"{where}kind", f"must be slow or stop (got {kind!r})")


@dataclass(frozen=True)
class Step:
    report: IterationReport
    end_s: float  # wall clock at the end of the iteration
    stopped_at: Mapping[int, float]  # rank -> wall clock when it went silent


class Generator:
    def __init__(self, cfg: BenchConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        L = cfg.layout
        mult = 1 + STAGE_SPREAD * self.rng.uniform(-1, 1, L.pp)
        mult[-1] *= LM_HEAD
        self.alpha = MICROBATCH_SECONDS * mult / cfg.tokens_per_microbatch
        self.beta = self.alpha / CROSSOVER
        self._lengths: list[int] = []

    def _length(self) -> int:
        if not self._lengths:
            c = self.cfg
            drawn = self.rng.lognormal(math.log(c.seq_median), c.seq_sigma, 4096)
            self._lengths = [int(v) for v in np.clip(np.rint(drawn), 1, c.seq_max)]
        return self._lengths.pop()

    def _micro_batch(self) -> MicroBatch:
        budget = self.cfg.tokens_per_microbatch
        out = [self._length()]
        while True:
            n = self._length()
            if sum(out) + n > budget:
                self._lengths.append(n)  # starts the next micro-batch
                return tuple(out)
            out.append(n)

    def __iter__(self) -> Iterator[Step]:
        c, L = self.cfg, self.cfg.layout
        now = 0.0
        stopped: dict[int, float] = {}
        for it in range(c.iterations):
            for f in c.faults:
                if f.kind == STOP and f.start == it:
                    stopped[f.rank] = now
            gone = {L.replica(r) for r in stopped}
            slow = np.ones(L.ranks)
            for f in c.faults:
                if f.kind == SLOW and f.active(it):
                    slow[f.rank] *= f.factor
            mbs = tuple(tuple(self._micro_batch() for _ in range(c.microbatches)) for _ in range(L.dp))
            seconds: list[float | None] = [None] * L.ranks
            spans = []
            for d in range(L.dp):
                tokens = np.array([sum(mb) for mb in mbs[d]], float)
                squares = np.array([sum(n * n for n in mb) for mb in mbs[d]], float)
                stage_cost = np.outer(self.alpha, tokens) + np.outer(self.beta, squares)  # pp x m
                noise = np.clip(1 + c.noise * self.rng.standard_normal((L.tp, L.pp, c.microbatches)), 0.2, None)
                hiccup = np.where(self.rng.random((L.tp, L.pp)) < c.hiccup_rate, self.rng.uniform(1.2, 2.0, (L.tp, L.pp)), 1.0)
                ranks = np.array([[L.rank(t, s, d) for s in range(L.pp)] for t in range(L.tp)])
                per_rank = stage_cost[None, :, :] * noise * (slow[ranks] * hiccup)[:, :, None]  # tp x pp x m
                if d in gone:
                    continue
                for t in range(L.tp):
                    for s in range(L.pp):
                        seconds[ranks[t, s]] = float(per_rank[t, s].sum())
                spans.append(makespan(per_rank.max(axis=0).tolist()))
            took = max(spans, default=0.0) + ALLREDUCE_SECONDS * max(0.2, 1 + c.noise * self.rng.standard_normal())
            report = IterationReport(it, L, tuple(seconds), mbs, took)
            now += took
            yield Step(report, now, dict(stopped))
