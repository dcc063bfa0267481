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

Model mismatch (what the detector does not model; `mismatch` in the config): `jitter` σ
gives every micro-batch a lognormal factor shared by all its stages (input stalls, a
collective's jitter); `cubic` c adds c·β/CROSSOVER·Σ lᵢ³ (attention with a cubic tail: at
CROSSOVER tokens the cubic term is c times the quadratic one); a `link` fault delays every
micro-batch crossing from `stage` to the next by `seconds` (a slow link, not a slow device:
the ranks' busy times do not change, the step does; the right verdict names the job, −1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rota.core.detection.failslow import JOB, SLOW, STOP, DetectorConfig
from rota.core.detection.layout import IterationReport, Layout, MicroBatch
from rota.core.detection.pipeline import makespan
from rota.core.errors import InvalidArgument
from rota.core.schema import Check, Field, Schema, validate

MICROBATCH_SECONDS = 0.06  # F+B+W of a full micro-batch of short sequences on one stage
CROSSOVER = 8192  # tokens at which attention costs as much as the per-token work
LM_HEAD = 1.15  # the last stage's extra cost
STAGE_SPREAD = 0.1  # stages differ by up to ±10% (uneven layer costs)
ALLREDUCE_SECONDS = 0.1
LINK = "link"


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    start: int
    end: int | None = None  # exclusive; None = to the end
    factor: float = 1.0  # slow: the slowdown; link: the delay per micro-batch, seconds

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
    jitter: float = 0.0
    cubic: float = 0.0

    def scored_faults(self) -> tuple[Fault, ...]:
        """The faults as a verdict must name them: a slow link is the job's, not a rank's."""
        return tuple(Fault(SLOW, JOB, f.start, f.end, f.factor) if f.kind == LINK else f for f in self.faults)


def _int(**options: Any) -> Field:
    """An integer, required unless it has a default or `required=False` says otherwise."""
    return Field(kind=int, what="an integer", **{"required": "default" not in options, **options})


def _finite(x: float) -> str | None:
    return None if math.isfinite(x) else "must be finite"


def _float(**options: Any) -> Field:
    """A finite number read as a float, required as `_int`."""
    checks = (_finite, *options.pop("checks", ()))
    return Field(kind=float, what="a number", convert=lambda v: float(v) if type(v) is int else v, checks=checks,
                 **{"required": "default" not in options, **options})


def _below(limit: float) -> Check:
    return lambda x: None if x < limit else f"must be below {limit:g} (got {x})"


def _seq_max(seq: dict[str, Any]) -> list[tuple[str, str]]:
    return [] if seq["max"] >= seq["median"] else [("max", f"must be at least the median {seq['median']:g}")]


def _enough_layers(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    pp = cfg["layout"]["pp"]
    return [] if cfg["layers"] >= pp else [("layers", f"must be at least the pipeline's {pp} stages (got {cfg['layers']})")]


CONFIG = Schema({
    "seed": _int(), "iterations": _int(low=1),
    "layout": Field(kind=dict, what="an object", required=True, schema=Schema({k: _int(low=1) for k in ("tp", "pp", "dp")})),
    "microbatches": _int(low=1),
    "seq_len": Field(kind=dict, what="an object", required=True, schema=Schema({
        "median": _float(low=1), "sigma": _float(low=0), "max": _int(),
    }, checks=(_seq_max,))),
    "tokens_per_microbatch": _int(low=1),
    "noise": _float(low=0, checks=(_below(1),)),
    "faults": Field(kind=list, what="a list", required=True),
    "trials": _int(default=1, low=1, high=1000),
    "hiccup_rate": _float(default=0.002, low=0, checks=(_below(1),)),
    "heartbeat_interval_s": _float(default=1.0, checks=(lambda x: None if x > 0 else f"must be positive (got {x})",)),
    "layers": _int(default=32),
    "mismatch": Field(kind=dict, what="an object", default={}, schema=Schema({
        "jitter": _float(default=0.0, low=0, checks=(_below(1),)), "cubic": _float(default=0.0, low=0),
    })),
    # DetectorConfig's own defaults and ranges apply to what is given.
    "detector": Field(kind=dict, what="an object", default={}, schema=Schema({
        "threshold": _float(required=False), "consecutive": _int(required=False), "warmup": _int(required=False),
        "decay": _float(required=False), "window": _int(required=False),
    })),
}, checks=(_enough_layers,))


def _fault_schema(ranks: int, pp: int) -> Callable[[Mapping[str, Any]], Schema]:
    """A fault's fields, by its kind, in a job of `ranks` ranks and `pp` stages."""
    common = {"kind": Field(), "rank": _int(low=0, high=ranks - 1, range_reason=f"must be in 0..{ranks - 1} (got {{value}})")}
    slow = Schema({**common, "factor": _float(checks=(lambda x: None if x > 1 else f"must be above 1 (got {x})",)),
                   "from_iter": _int(), "to_iter": _int(default=None, nullable=True)})
    stop = Schema({**common, "at_iter": _int()})
    link = Schema({"kind": Field(), "stage": _int(low=0, high=pp - 2, range_reason=f"must be in 0..{pp - 2}: a link "
                                                                                     f"to the next stage (got {{value}})"),
                   "seconds": _float(checks=(lambda x: None if x > 0 else f"must be positive (got {x})",)),
                   "from_iter": _int(), "to_iter": _int(default=None, nullable=True)})
    kinds = {SLOW: slow, STOP: stop, LINK: link}

    def by_kind(fault: Mapping[str, Any]) -> Schema:
        kind = fault.get("kind")
        if kind in kinds:
            return kinds[kind]
        return Schema({}, closed=False, checks=(lambda _: [("kind", f"must be slow, stop or link (got {kind!r})")],))
    return by_kind


def parse_config(data: Any) -> BenchConfig:
    """The issue's JSON shape; `trials`, `hiccup_rate`, `heartbeat_interval_s`, `layers` and
    `detector` ({threshold, consecutive, warmup, decay, window}) are optional. InvalidArgument
    (a rota.core.schema.SchemaError) names the bad field."""
    if not isinstance(data, dict):
        raise InvalidArgument("config", "must be a JSON object")
    cfg = validate(CONFIG, data)
    layout = Layout(**cfg["layout"])
    faults = validate(Schema({"faults": Field(items=Field(kind=dict, what="an object", type_reason="must be an object",
                                                          schema=_fault_schema(layout.ranks, layout.pp)))}),
                      {"faults": cfg["faults"]})["faults"]
    try:
        detector = DetectorConfig(**cfg["detector"])
    except InvalidArgument as e:
        raise InvalidArgument(f"detector.{e.field}", str(e).removeprefix(f"{e.field}: ")) from None
    seq = cfg["seq_len"]
    return BenchConfig(
        seed=cfg["seed"], iterations=cfg["iterations"], layout=layout, microbatches=cfg["microbatches"],
        seq_median=seq["median"], seq_sigma=seq["sigma"], seq_max=seq["max"],
        tokens_per_microbatch=cfg["tokens_per_microbatch"], noise=cfg["noise"], faults=tuple(map(_fault, faults)),
        trials=cfg["trials"], hiccup_rate=cfg["hiccup_rate"], heartbeat_interval_s=cfg["heartbeat_interval_s"],
        layers=cfg["layers"], detector=detector, jitter=cfg["mismatch"]["jitter"], cubic=cfg["mismatch"]["cubic"],
    )


def _fault(f: dict[str, Any]) -> Fault:
    if f["kind"] == SLOW:
        return Fault(SLOW, f["rank"], f["from_iter"], f["to_iter"], f["factor"])
    if f["kind"] == LINK:
        return Fault(LINK, f["stage"], f["from_iter"], f["to_iter"], f["seconds"])
    return Fault(STOP, f["rank"], f["at_iter"])


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
        self.gamma = cfg.cubic * self.beta / CROSSOVER
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

    def _factors(self, it: int) -> tuple[np.ndarray, np.ndarray]:
        """(each rank's slowdown, the delay per micro-batch arriving at each stage) at iteration `it`."""
        c, L = self.cfg, self.cfg.layout
        slow, link = np.ones(L.ranks), np.zeros(L.pp)
        for f in c.faults:
            if f.kind == SLOW and f.active(it):
                slow[f.rank] *= f.factor
            elif f.kind == LINK and f.active(it):
                link[f.rank + 1] += f.factor
        return slow, link

    def _stage_cost(self, mbs: tuple[MicroBatch, ...]) -> np.ndarray:
        """pp x m: each micro-batch's cost on each stage (with the mismatch terms, if any)."""
        c = self.cfg
        tokens = np.array([sum(mb) for mb in mbs], float)
        squares = np.array([sum(n * n for n in mb) for mb in mbs], float)
        cost = np.outer(self.alpha, tokens) + np.outer(self.beta, squares)
        if c.cubic:
            cost = cost + np.outer(self.gamma, np.array([sum(n ** 3 for n in mb) for mb in mbs], float))
        if c.jitter:
            cost = cost * np.exp(c.jitter * self.rng.standard_normal(len(mbs)))[None, :]
        return cost

    def __iter__(self) -> Iterator[Step]:
        c, L = self.cfg, self.cfg.layout
        now = 0.0
        stopped: dict[int, float] = {}
        for it in range(c.iterations):
            stopped.update({f.rank: now for f in c.faults if f.kind == STOP and f.start == it})
            gone = {L.replica(r) for r in stopped}
            slow, link = self._factors(it)
            mbs = tuple(tuple(self._micro_batch() for _ in range(c.microbatches)) for _ in range(L.dp))
            seconds: list[float | None] = [None] * L.ranks
            spans = []
            for d in range(L.dp):
                stage_cost = self._stage_cost(mbs[d])  # pp x m
                noise = np.clip(1 + c.noise * self.rng.standard_normal((L.tp, L.pp, c.microbatches)), 0.2, None)
                hiccup = np.where(self.rng.random((L.tp, L.pp)) < c.hiccup_rate, self.rng.uniform(1.2, 2.0, (L.tp, L.pp)), 1.0)
                ranks = np.array([[L.rank(t, s, d) for s in range(L.pp)] for t in range(L.tp)])
                per_rank = stage_cost[None, :, :] * noise * (slow[ranks] * hiccup)[:, :, None]  # tp x pp x m
                if d in gone:
                    continue
                for t in range(L.tp):
                    for s in range(L.pp):
                        seconds[ranks[t, s]] = float(per_rank[t, s].sum())
                # A slow link holds each micro-batch back on its way in: on the critical path, not in busy time.
                spans.append(makespan((per_rank.max(axis=0) + link[:, None]).tolist()))
            took = max(spans, default=0.0) + ALLREDUCE_SECONDS * max(0.2, 1 + c.noise * self.rng.standard_normal())
            report = IterationReport(it, L, tuple(seconds), mbs, took)
            now += took
            yield Step(report, now, dict(stopped))
