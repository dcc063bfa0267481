"""Agentic workloads: a seeded generator of agents and a driver that runs them on the engine.

An agent's life is ``turns`` steps: it sends its whole history (a system prompt all agents
share, its own task prompt, every earlier turn's generated and observed tokens) and
generates ``gen_tokens``; then it calls a tool (a latency drawn from ``tool_latency_s``)
and appends ``obs_tokens`` of observation before its next step. Everything an agent will
see is drawn up front from ``seed``, so every arm of a benchmark faces the same batch.

Time is a discrete virtual clock: an engine step advances it by the step's cost, by
default its MEASURED cost, the CPU time of this thread in the step (``time.thread_time``;
torch runs in this thread with one intra-op thread), so the other processes of a contended
machine do not stretch it, or the cost a model fitted to such measurements gives
(``rota.bench.fitted_clock``); tool calls advance it by their drawn latency without
sleeping; while the engine has nothing to do the clock jumps to the next tool return or
control tick.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from heapq import heappop, heappush
from typing import Any, Protocol

from rota.jobkit.inference.clock import MeasuredClock, StepClock
from rota.jobkit.inference.engine import Engine, EngineConfig
from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig, Decision
from rota.jobkit.inference.kvcache import BLOCK_SIZE
from rota.jobkit.inference.model import ModelConfig

__all__ = ["AgentPlan", "Gate", "RunResult", "Workload", "make_plans", "parse_workload", "run_workload", "static_gate"]


@dataclass(frozen=True)
class Workload:
    name: str
    agents: int
    turns: tuple[int, int]  # per agent, drawn uniformly from [lo, hi]
    gen_tokens: int
    obs_tokens: int
    tool_latency_s: tuple[float, float]
    cache_blocks: int
    seed: int = 0
    prompt_tokens: int = 64
    shared_prefix_tokens: int = 32
    token_budget: int = 512
    control_interval_s: float = 0.25
    series_interval_s: float = 0.1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        _at_least("agents", self.agents, 1)
        lo, hi = self.turns
        if lo < 1 or hi < lo:
            raise ValueError(f"turns: must be at least 1 (as [lo, hi], lo <= hi), got {list(self.turns)}")
        for name, least in (("gen_tokens", 1), ("obs_tokens", 0), ("prompt_tokens", 1), ("shared_prefix_tokens", 0)):
            _at_least(name, getattr(self, name), least)
        a, b = self.tool_latency_s
        if a < 0 or b < a:
            raise ValueError(f"tool_latency_s: must be [lo, hi] with 0 <= lo <= hi, got {list(self.tool_latency_s)}")
        _at_least("token_budget", self.token_budget, 1)
        for name in ("control_interval_s", "series_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        self._check_cache()

    def _check_cache(self) -> None:
        """The cache holds one agent's first turn, and its last."""
        first = self.shared_prefix_tokens + self.prompt_tokens + self.gen_tokens
        if self.cache_blocks * BLOCK_SIZE < first:
            raise ValueError(f"cache_blocks: {self.cache_blocks} blocks hold {self.cache_blocks * BLOCK_SIZE} tokens, "
                             f"fewer than one agent's first turn ({first} tokens)")
        if self.cache_blocks * BLOCK_SIZE < self.longest_context:
            raise ValueError(f"cache_blocks: {self.cache_blocks} blocks hold {self.cache_blocks * BLOCK_SIZE} tokens, "
                             f"fewer than one agent's last turn ({self.longest_context} tokens)")

    @property
    def longest_context(self) -> int:
        hi = self.turns[1]
        return self.shared_prefix_tokens + self.prompt_tokens + hi * self.gen_tokens + (hi - 1) * self.obs_tokens


def _at_least(name: str, value: int, least: int) -> None:
    if value < least:
        raise ValueError(f"{name}: must be at least {least}, got {value}" if least else
                         f"{name}: must not be negative, got {value}")


def _turns(turns: Any) -> tuple[int, int]:
    """A workload's `turns`: N or [lo, hi]."""
    if isinstance(turns, int) and not isinstance(turns, bool):
        return (turns, turns)
    if isinstance(turns, list | tuple) and len(turns) == 2 and all(isinstance(t, int) for t in turns):
        return (int(turns[0]), int(turns[1]))
    raise ValueError(f"turns: must be an integer or [lo, hi], got {turns!r}")


def _check_number_types(values: Mapping[str, Any]) -> None:
    for name in ("agents", "gen_tokens", "obs_tokens", "cache_blocks", "seed", "prompt_tokens",
                 "shared_prefix_tokens", "token_budget"):
        if name in values and (not isinstance(values[name], int) or isinstance(values[name], bool)):
            raise ValueError(f"{name}: must be an integer, got {values[name]!r}")
    for name in ("control_interval_s", "series_interval_s"):
        if name in values and not isinstance(values[name], int | float):
            raise ValueError(f"{name}: must be a number, got {values[name]!r}")


def parse_workload(raw: Mapping[str, Any]) -> Workload:
    """A workload from JSON data; a wrong field is refused with a ValueError naming it."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"workload: must be an object, got {type(raw).__name__}")
    known = {f.name for f in fields(Workload)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown workload field (known: {', '.join(sorted(known))})")
    for required in ("name", "agents", "turns", "gen_tokens", "obs_tokens", "tool_latency_s", "cache_blocks"):
        if required not in raw:
            raise ValueError(f"{required}: missing from the workload")
    values: dict[str, Any] = dict(raw)
    values["turns"] = _turns(values["turns"])
    latency = values["tool_latency_s"]
    if not (isinstance(latency, list | tuple) and len(latency) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in latency)):
        raise ValueError(f"tool_latency_s: must be [lo, hi] in seconds, got {latency!r}")
    values["tool_latency_s"] = (float(latency[0]), float(latency[1]))
    _check_number_types(values)
    if not isinstance(values["name"], str):
        raise ValueError(f"name: must be a string, got {values['name']!r}")
    return Workload(**values)


@dataclass(frozen=True)
class AgentPlan:
    agent: str
    prompt: list[int]  # the shared prefix, then the agent's own prompt
    observations: list[list[int]]  # appended after turn i (one fewer than turns)
    latencies: list[float]  # of the tool call after turn i

    @property
    def turns(self) -> int:
        return len(self.observations) + 1


def make_plans(w: Workload, vocab: int) -> list[AgentPlan]:
    rng = random.Random(w.seed)
    shared = [rng.randrange(vocab) for _ in range(w.shared_prefix_tokens)]
    plans: list[AgentPlan] = []
    for i in range(w.agents):
        turns = rng.randint(*w.turns)
        own = [rng.randrange(vocab) for _ in range(w.prompt_tokens)]
        obs = [[rng.randrange(vocab) for _ in range(w.obs_tokens)] for _ in range(turns - 1)]
        lat = [rng.uniform(*w.tool_latency_s) for _ in range(turns - 1)]
        plans.append(AgentPlan(f"a{i:03d}", shared + own, obs, lat))
    return plans


def static_gate(cap: int) -> AdmissionController:
    """A fixed window: ``observe`` is never called on it, so it neither grows nor shrinks."""
    return AdmissionController(ControllerConfig(w_min=1, w_max=cap, w_init=cap))


@dataclass
class RunResult:
    tokens_per_s: float
    makespan_s: float
    recompute_ratio: float
    hit_rate: float
    evictions: int
    mean_usage: float
    preemptions: int
    generated: int
    recomputed: int
    series: list[dict[str, float]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens_per_s": round(self.tokens_per_s, 2), "makespan_s": round(self.makespan_s, 3),
            "recompute_ratio": round(self.recompute_ratio, 4), "hit_rate": round(self.hit_rate, 4),
            "evictions": self.evictions, "mean_cache_usage": round(self.mean_usage, 4),
            "preemptions": self.preemptions, "generated_tokens": self.generated,
            "recomputed_tokens": self.recomputed, "series": self.series,
        }


SampleSource = Callable[[Engine], CacheSample | None]


class Gate(Protocol):
    """What the driver needs of an admission controller (``AdmissionController``, or
    ``rota.jobkit.inference.admission.ScrapedAdmission`` when HTTP clients share it)."""

    @property
    def active(self) -> tuple[str, ...]: ...

    def request(self, agent: str, tokens: int | None = None) -> bool: ...

    def release(self, agent: str) -> tuple[str, ...]: ...

    def observe(self, sample: CacheSample | None, now: float) -> Decision: ...


def engine_for(w: Workload, model: ModelConfig | None = None) -> Engine:
    return Engine(EngineConfig(cache_blocks=w.cache_blocks, token_budget=w.token_budget, model=model or ModelConfig()))


def run_workload(w: Workload, gate: Gate, *, engine: Engine | None = None,
                 sample: SampleSource | None = None, clock: StepClock | None = None, skip: Iterable[str] = (),
                 on_done: Callable[[str, list[int]], None] | None = None,
                 on_interval: Callable[[Decision, Engine, float], None] | None = None) -> RunResult:
    """Runs every agent of ``w`` to its end under ``gate``. With ``sample`` the gate is a
    controller: each control interval it observes the engine's sample (None: no answer)."""
    engine = engine or engine_for(w)
    plans = {p.agent: p for p in make_plans(w, engine.config.model.vocab) if p.agent not in set(skip)}
    run = _Run(w, gate, engine, plans, clock or MeasuredClock(), on_done)
    if sample is not None:  # a controller reads the engine (its cache's size) before any agent asks
        run.control(sample)
    for a in plans:
        if run.request(a):
            run.submit([a])
    while run.done < len(plans):
        if engine.has_work():
            run.step()
        elif not run.idle(sample is not None):
            break  # nothing can happen any more (cannot occur with a window of at least 1)
        run.wake()
        if sample is not None and run.now >= run.next_control:
            decision = run.control(sample)
            if on_interval is not None:
                on_interval(decision, engine, run.now)
    return run.series.result(run.now, run.decisions)


class _Run:
    """`run_workload`'s state: each agent's history and turn, the tool calls pending, the clock."""

    def __init__(self, w: Workload, gate: Gate, engine: Engine, plans: dict[str, AgentPlan], clock: StepClock,
                 on_done: Callable[[str, list[int]], None] | None) -> None:
        self.w, self.gate, self.engine, self.plans, self.clock, self.on_done = w, gate, engine, plans, clock, on_done
        self.history = {a: list(p.prompt) for a, p in plans.items()}
        self.turn = dict.fromkeys(plans, 0)
        self.wakes: list[tuple[float, int, str]] = []
        self.now, self.next_control = 0.0, w.control_interval_s
        self.decisions: list[dict[str, Any]] = []
        self.series = _Series(w.series_interval_s, engine)
        self.done = 0
        self.counter = 0

    def submit(self, agents: Iterable[str]) -> None:
        for a in agents:
            self.engine.add_request(f"{a}/{self.turn[a]}", self.history[a], self.w.gen_tokens)

    def step(self) -> None:
        """One engine step; each finished turn ends its agent or calls its tool."""
        finished, cost = self.clock.step(self.engine)
        self.series.step(self.now, cost, len(self.gate.active))
        self.now += cost
        for out in finished:
            a = out.request_id.split("/")[0]
            self.history[a] += out.tokens
            self.turn[a] += 1
            if self.turn[a] == self.plans[a].turns:
                self.done += 1
                if self.on_done is not None:
                    self.on_done(a, self.history[a])
                self.submit(self.gate.release(a))
            else:
                self.counter += 1
                heappush(self.wakes, (self.now + self.plans[a].latencies[self.turn[a] - 1], self.counter, a))

    def idle(self, controlled: bool) -> bool:
        """No work: the clock moves to the next tool return or control point; False if none comes."""
        upcoming = [t for t in (self.wakes[0][0] if self.wakes else None, self.next_control if controlled else None)
                    if t is not None]
        if not upcoming:
            return False
        later = max(self.now, min(upcoming))
        self.series.idle(self.now, later, len(self.gate.active))
        self.now = later
        return True

    def wake(self) -> None:
        """Agents whose tool call returned append its observation and ask for their next turn."""
        while self.wakes and self.wakes[0][0] <= self.now:
            _, _, a = heappop(self.wakes)
            self.history[a] += self.plans[a].observations[self.turn[a] - 1]
            if self.request(a):
                self.submit([a])

    def request(self, agent: str) -> bool:
        """The gate's answer for ``agent``'s next turn, which holds its history and generation."""
        return self.gate.request(agent, len(self.history[agent]) + self.w.gen_tokens)

    def control(self, sample: SampleSource) -> Decision:
        decision = self.gate.observe(sample(self.engine), self.now)
        self.submit(decision.admitted)
        self.decisions.append({"t": round(self.now, 3), "window": decision.window, "action": decision.action,
                               "reason": decision.reason})
        self.next_control = self.now + self.w.control_interval_s
        return decision


class _Series:
    """Per-window throughput, active agents, usage and hit rate, and the run's totals."""

    def __init__(self, interval: float, engine: Engine) -> None:
        self.interval, self.engine = interval, engine
        self.points: list[dict[str, float]] = []
        self.usage_time = 0.0
        self._start = 0.0
        self._window_usage = 0.0
        self._active_time = 0.0
        self._mark = (0, 0, 0)

    def step(self, now: float, cost: float, active: int) -> None:
        self._account(now, cost, self.engine.counters.usage, active)

    def idle(self, now: float, until: float, active: int) -> None:
        self._account(now, until - now, 0.0, active)

    def _account(self, now: float, span: float, usage: float, active: int) -> None:
        self.usage_time += usage * span
        self._window_usage += usage * span
        self._active_time += active * span
        if now + span - self._start >= self.interval:
            self._close(now + span)

    def _close(self, end: float) -> None:
        c = self.engine.counters
        span = max(end - self._start, 1e-9)
        gen, queries, hits = c.generated - self._mark[0], c.prefix_queries - self._mark[1], c.prefix_hits - self._mark[2]
        self.points.append({
            "t": round(end, 3), "tokens_per_s": round(gen / span, 2), "active_agents": round(self._active_time / span, 2),
            "usage": round(self._window_usage / span, 4), "hit_rate": round(hits / queries, 4) if queries else 0.0,
            "progress_tokens": c.generated,
        })
        self._start, self._window_usage, self._active_time = end, 0.0, 0.0
        self._mark = (c.generated, c.prefix_queries, c.prefix_hits)

    def result(self, now: float, decisions: list[dict[str, Any]]) -> RunResult:
        if now > self._start:
            self._close(now)
        c = self.engine.counters
        makespan = max(now, 1e-9)
        return RunResult(
            tokens_per_s=c.generated / makespan, makespan_s=now, recompute_ratio=c.recomputed / max(c.generated, 1),
            hit_rate=c.prefix_hits / max(c.prefix_queries, 1), evictions=c.evictions,
            mean_usage=self.usage_time / makespan, preemptions=c.preemptions, generated=c.generated,
            recomputed=c.recomputed, series=self.points, decisions=decisions,
        )
