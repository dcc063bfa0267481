"""CONCUR's KV-cache admission window: which agents of an agentic batch may hold a place in
the inference engine's KV cache (agent-level admission control), as pure logic. Not job
admission: it runs inside a job, beside the engine (`rota.jobkit.inference`), and no service
uses it.

The number of *active* agents is a congestion window W over the engine's KV cache. An
agent holds a slot from its admission until it finishes, through its tool calls, because
its history sits in the cache while it waits; the window bounds how many histories share
the cache at once. The rules (CONCUR; the constants are ours, chosen by measurement with
``rota bench concur``):

- the window is binding (agents held, all slots taken) and the cache is healthy: it grows,
  doubling until the first sign of congestion (slow start, as TCP), then by
  ``additive_step`` per control interval; the first eviction of a cached block also ends
  the doubling (the cache is full of histories: from here one more agent may displace a
  live one), without shrinking the window;
- thrashing: live agents' blocks were evicted (the engine recomputes their prefixes:
  recomputed prefill tokens above ``recompute_tolerance`` of the interval's queried
  tokens), or the engine preempted a request, or usage is at least ``usage_high`` while the
  interval's prefix hit rate fell more than ``hit_drop`` below its moving average: the
  window shrinks to ``max(w_min, floor(W * decrease_factor))``, at most once per
  ``cooldown_s`` (the signals of one decrease arrive a turn later); recompute within
  ``cooldown_s`` of readmitting agents this controller paused is their price (they lost
  their cache while held), not congestion, and holds the window;
- an engine that counts no recomputed tokens (vLLM): a fall of the interval's hit rate more
  than ``hit_drop`` below its average shrinks the window whatever the usage (vLLM counts
  the cached blocks of agents in their tool calls as free), as deep as the fall;
- usage at least ``usage_high`` with no other sign: the window holds (near saturation);
- no sample (the metrics endpoint stopped answering): the window holds where it is and the
  decision says so; admissions go on only within it, never without limit.

**What fits at admission** (``admit_within_cache``): once a scrape gave the cache's size
(``vllm:cache_config_info``: blocks and tokens per block), an agent is admitted only if its
next turn (the tokens its request will hold: history and generation, which the agent says at
``request``) fits in the cache's blocks beside the last-known turns of the agents already
active, or no agent is active. Congestion signals all come after the fact: a batch that
starts with every agent submitted has paid for their prefills before the first scrape can
show a queue, and the histories of the agents a cut then pauses are evicted while they wait.
This check needs no constant: the engine gives its size and the agent its length. The window
is still the law's, and the smaller of the two binds.

**Recompute from what was served** (``recompute_from_served``, off by default): an engine
that counts no recompute (vLLM) still says, per request, how many prompt tokens it served
from its cache (OpenAI's ``usage.prompt_tokens_details.cached_tokens``). The caller reports
it (``served``); the full blocks of the agent's previous turn that were not served cached are
a live agent's history recomputed, and count as the recompute the law reads. Off by default:
it pays where prefill is expensive and costs concurrency where it is cheap.

Agents are admitted or held only at their step boundaries (``request`` is called between
an agent's generations), never mid-generation. An active agent reaching a boundary while
more agents are active than the window allows gives up its slot and waits; held agents are
admitted in the order they were held. Nothing here reads a clock: ``now`` is passed in,
in whatever seconds the caller keeps (a virtual clock in the benchmark).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["AdmissionController", "CacheSample", "ControllerConfig", "Decision"]


@dataclass(frozen=True)
class ControllerConfig:
    w_min: int = 1
    w_max: int = 1024
    w_init: int = 4
    additive_step: int = 1
    decrease_factor: float = 0.7
    usage_high: float = 0.9
    hit_drop: float = 0.10
    ewma_alpha: float = 0.3
    recompute_tolerance: float = 0.05
    cooldown_s: float = 1.0
    slow_start: bool = True
    pause_on_shrink: bool = True
    severity_floor: float = 1.0  # < 1: a recompute of fraction f cuts W to W * max(floor, 1 - f) if smaller
    admit_within_cache: bool = True  # admit an agent only if its next turn fits beside the active agents'
    # where the engine counts no recompute (vLLM), count it from what requests were served
    # from the cache (`served`): a live agent's history evicted. Off by default: on vLLM with
    # the tiny model, where prefill is cheap, the cuts it makes cost more concurrency than
    # they save in prefill (bench/concur/README.md); it pays where prefill is expensive
    recompute_from_served: bool = False

    def __post_init__(self) -> None:
        if self.w_min < 1:
            raise ValueError(f"w_min: must be at least 1, got {self.w_min}")
        if self.w_max < self.w_min:
            raise ValueError(f"w_max: must be at least w_min ({self.w_min}), got {self.w_max}")
        if not self.w_min <= self.w_init <= self.w_max:
            raise ValueError(f"w_init: must lie in [w_min, w_max] = [{self.w_min}, {self.w_max}], got {self.w_init}")
        if self.additive_step < 1:
            raise ValueError(f"additive_step: must be at least 1, got {self.additive_step}")
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(f"decrease_factor: must lie in (0, 1), got {self.decrease_factor}")
        self._check_fractions()
        if self.cooldown_s < 0:
            raise ValueError(f"cooldown_s: must not be negative, got {self.cooldown_s}")

    def _check_fractions(self) -> None:
        for name in ("usage_high", "hit_drop", "recompute_tolerance"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: must lie in [0, 1], got {value}")
        for name in ("severity_floor", "ewma_alpha"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: must lie in (0, 1], got {value}")


@dataclass(frozen=True)
class CacheSample:
    """One scrape of an engine. Counters are cumulative (None: the engine does not export
    them); ``hit_rate`` is an engine's own rate gauge (SGLang), used when no counters are."""

    usage: float
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None
    recomputed_tokens: float | None = None
    evictions: float | None = None  # cached blocks evicted (ours: rota:kv_block_evictions_total)
    hit_rate: float | None = None
    generated: float | None = None  # generated tokens (vllm:generation_tokens_total): goodput
    running: float | None = None  # requests in the batch (vllm:num_requests_running)
    waiting: float | None = None  # requests queued, not yet scheduled (vllm:num_requests_waiting)
    # the cache's size (vllm:cache_config_info's num_gpu_blocks and block_size labels)
    cache_blocks: float | None = None
    block_tokens: float | None = None


@dataclass(frozen=True)
class Decision:
    window: int
    action: str  # "increase", "decrease", "hold" or "no_signal"
    reason: str
    active: int
    held: int
    usage: float | None = None
    hit_rate: float | None = None
    hit_ewma: float | None = None
    admitted: tuple[str, ...] = ()


def _delta(now: float | None, before: float | None) -> float | None:
    if now is None or before is None or now < before:  # absent, or the counter was reset
        return None
    return now - before


@dataclass
class _State:
    window: int
    slow_start: bool
    active: list[str] = field(default_factory=list)
    held: deque[str] = field(default_factory=deque)
    hit_ewma: float | None = None
    last_decrease: float | None = None
    missing_since: float | None = None
    previous: CacheSample | None = None
    paused: set[str] = field(default_factory=set)  # gave their slot up on a shrink; not yet back
    resumed: int = 0  # paused agents readmitted since the last observe
    last_resume: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)  # each agent's next (or current) turn, as it said
    earlier: dict[str, int] = field(default_factory=dict)  # and the turn before it: what should be cached
    recomputed: int = 0  # tokens of live agents' histories the engine served uncached (`served`)
    served: bool = False  # whether any request's cached tokens were reported
    cache: tuple[float, float] | None = None  # (blocks, tokens per block), once a scrape said


class AdmissionController:
    def __init__(self, config: ControllerConfig, state: dict[str, Any] | None = None) -> None:
        self.config = config
        self._s = _State(window=config.w_init, slow_start=config.slow_start)
        if state is not None:
            self._load(state)

    # -- the window and its agents -------------------------------------------------------
    @property
    def window(self) -> int:
        return self._s.window

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(self._s.active)

    @property
    def held(self) -> tuple[str, ...]:
        return tuple(self._s.held)

    def request(self, agent: str, tokens: int | None = None) -> bool:
        """An agent at a step boundary asks to run its next step: True if it may now.
        ``tokens``: what that step's request holds in the cache (its history and the tokens
        it generates), if the caller knows; then it is only admitted where it fits.

        False means it is held; it is handed back by a later ``release`` or ``observe``
        (in their ``admitted``), in the order agents were held.
        """
        s = self._s
        self._note(agent, tokens)
        if agent in s.active:
            if len(s.active) <= s.window or not self.config.pause_on_shrink:
                return True
            s.active.remove(agent)  # the window shrank: give the slot up between steps
            s.held.append(agent)
            s.paused.add(agent)
            return False
        if agent in s.held:
            return False
        if not s.held and len(s.active) < s.window and self._fits(agent):
            s.active.append(agent)
            return True
        s.held.append(agent)
        return False

    def _note(self, agent: str, tokens: int | None) -> None:
        s = self._s
        if tokens is None:
            return
        if agent in s.tokens and s.tokens[agent] != tokens:
            s.earlier[agent] = s.tokens[agent]
        s.tokens[agent] = tokens

    def served(self, agent: str, prompt_tokens: int, cached_tokens: int) -> None:
        """``agent``'s request finished: of its ``prompt_tokens``, ``cached_tokens`` came from
        the engine's prefix cache (OpenAI's ``usage.prompt_tokens_details.cached_tokens``).
        Its previous turn's full blocks should have been cached; what was not is a live
        agent's history recomputed, the signal an engine without a recompute counter (vLLM)
        does not export. Not counted for agents this controller paused (`_excused`)."""
        s = self._s
        s.served = True
        before = s.earlier.get(agent)
        if before is None or s.cache is None or self._excused(agent):
            return
        per_block = s.cache[1]
        expected = min(prompt_tokens, int((before - 1) // per_block * per_block))
        s.recomputed += max(0, expected - cached_tokens)

    def _excused(self, agent: str) -> bool:
        return agent in self._s.paused

    def _with_served(self, sample: CacheSample) -> CacheSample:
        """The sample, with the recompute `served` counted where the engine counts none."""
        if sample.recomputed_tokens is not None or not self._s.served or not self.config.recompute_from_served:
            return sample
        return replace(sample, recomputed_tokens=float(self._s.recomputed))

    def _blocks(self, agent: str, per_block: float) -> int:
        return math.ceil(self._s.tokens.get(agent, 0) / per_block)

    def _fits(self, agent: str) -> bool:
        """Whether ``agent``'s next turn fits in the cache beside the active agents' (always,
        while the cache's size or its length is unknown, or when no agent is active)."""
        s = self._s
        if not self.config.admit_within_cache or s.cache is None or agent not in s.tokens or not s.active:
            return True
        blocks, per_block = s.cache
        return self._active_blocks(per_block) + self._blocks(agent, per_block) <= blocks

    def _active_blocks(self, per_block: float) -> int:
        """The cache blocks the active agents' turns hold, each counted as ``_blocks`` does."""
        return sum(self._blocks(a, per_block) for a in self._s.active)

    def window_binds(self) -> bool:
        """Agents wait because every slot of the window is taken (not because the cache is full)."""
        return bool(self._s.held) and len(self._s.active) >= self._s.window

    def release(self, agent: str) -> tuple[str, ...]:
        """An agent finished: its slot goes to the first held agents; returns them."""
        s = self._s
        if agent in s.active:
            s.active.remove(agent)
        elif agent in s.held:
            s.held.remove(agent)
        s.paused.discard(agent)
        s.tokens.pop(agent, None)
        s.earlier.pop(agent, None)
        return self._fill()

    def _fill(self) -> tuple[str, ...]:
        s = self._s
        admitted: list[str] = []
        while s.held and len(s.active) < s.window and self._fits(s.held[0]):
            agent = s.held.popleft()
            s.active.append(agent)
            admitted.append(agent)
            if agent in s.paused:
                s.paused.discard(agent)
                s.resumed += 1
        return tuple(admitted)

    # -- the control law ------------------------------------------------------------------
    def observe(self, sample: CacheSample | None, now: float) -> Decision:
        """One control interval: the engine's latest sample (None: it did not answer)."""
        s, c = self._s, self.config
        if sample is None:
            return self._no_signal(now)
        sample = self._with_served(sample)
        previous = self._accept(sample, now)
        hit, recompute_frac, preempted = self._interval(previous, sample)
        ewma = s.hit_ewma
        if hit is not None:
            s.hit_ewma = hit if ewma is None else (1 - c.ewma_alpha) * ewma + c.ewma_alpha * hit
        usage_high = sample.usage >= c.usage_high
        drop = ewma - hit if hit is not None and ewma is not None else 0.0
        # an engine that counts no recompute (vLLM) counts the cached blocks of agents in
        # their tool calls as free, so its usage never looks full while their histories are
        # evicted: there a fall of the hit rate is the evidence whatever the usage, and its
        # depth stands for the recomputed fraction
        blind = sample.recomputed_tokens is None and sample.hit_rate is None
        hit_fell = drop > c.hit_drop and (usage_high or blind)
        evicted_live = recompute_frac is not None and recompute_frac > c.recompute_tolerance
        lost = (evicted_live and not hit_fell) or (blind and hit_fell)  # and no other sign
        if lost and not preempted and s.last_resume is not None and now - s.last_resume <= c.cooldown_s:
            # agents this controller paused lost their cache while held: their recompute is
            # the price of the last decrease, not a sign that the window is still too large
            return self._decide("hold", "recompute of agents resumed after a pause", sample, hit)
        if preempted or evicted_live or hit_fell:
            why = ("the engine preempted requests" if preempted else
                   f"live agents' prefixes recomputed ({recompute_frac:.0%} of queried tokens)" if evicted_live else
                   f"usage {sample.usage:.0%} and hit rate {hit:.0%} fell below its average {ewma:.0%}")
            severity = recompute_frac if evicted_live else drop if blind and hit_fell else None
            return self._decrease(now, why, sample, hit, severity)
        if usage_high:
            return self._decide("hold", f"usage {sample.usage:.0%}: near saturation", sample, hit)
        return self._grow(sample, previous, hit)

    def _accept(self, sample: CacheSample, now: float) -> CacheSample | None:
        """Record an answered sample (and the end of a resume); the sample before it."""
        s = self._s
        s.missing_since = None
        if sample.cache_blocks and sample.block_tokens:
            s.cache = (sample.cache_blocks, sample.block_tokens)
        if s.resumed:
            s.last_resume, s.resumed = now, 0
        previous, s.previous = s.previous, sample
        return previous

    def _no_signal(self, now: float) -> Decision:
        s = self._s
        if s.missing_since is None:
            s.missing_since = now
        return self._decide(
            "no_signal",
            f"metrics endpoint not answering for {now - s.missing_since:.1f}s: window held at {s.window}",
        )

    def _decrease(self, now: float, why: str, sample: CacheSample, hit: float | None,
                  recompute_frac: float | None) -> Decision:
        """Multiplicative decrease (deeper for a large recompute of live agents' prefixes,
        `recompute_frac`), unless the last one is within the cooldown."""
        s, c = self._s, self.config
        if (ago := self._within_cooldown(now)) is not None:
            return self._decide("hold", f"{why}; decreased {ago:.1f}s ago", sample, hit)
        factor = c.decrease_factor
        if recompute_frac is not None:
            factor = min(factor, max(c.severity_floor, 1.0 - recompute_frac))
        s.window = max(c.w_min, math.floor(s.window * factor))
        s.slow_start = False
        s.last_decrease = now
        return self._decide("decrease", why, sample, hit)

    def _within_cooldown(self, now: float) -> float | None:
        """Seconds since the last decrease while that is within ``cooldown_s`` (a decrease's
        signals arrive a turn later: another now would count one event twice); None after."""
        last = self._s.last_decrease
        return None if last is None or now - last >= self.config.cooldown_s else now - last

    def _grow(self, sample: CacheSample, previous: CacheSample | None, hit: float | None) -> Decision:
        """A healthy cache: the window grows while agents are held (doubling in slow start,
        which the first eviction ends)."""
        s, c = self._s, self.config
        if not self.window_binds():
            return self._decide("hold", "window not binding: no agent waits for a slot", sample, hit)
        if s.slow_start and previous is not None and (_delta(sample.evictions, previous.evictions) or 0) > 0:
            s.slow_start = False
        grown = s.window * 2 if s.slow_start else s.window + c.additive_step
        s.window = min(c.w_max, grown)
        return self._decide("increase", "cache healthy and agents held", sample, hit)

    @staticmethod
    def _interval(previous: CacheSample | None, sample: CacheSample) -> tuple[float | None, float | None, bool]:
        """(prefix hit rate, recomputed / queried tokens, preempted) over the interval."""
        if previous is None:
            return sample.hit_rate, None, False
        queries = _delta(sample.prefix_queries, previous.prefix_queries)
        hits = _delta(sample.prefix_hits, previous.prefix_hits)
        recomputed = _delta(sample.recomputed_tokens, previous.recomputed_tokens)
        preemptions = _delta(sample.preemptions, previous.preemptions)
        hit: float | None = sample.hit_rate
        recompute_frac: float | None = None
        if queries is not None and queries > 0:
            if hits is not None:
                hit = min(1.0, hits / queries)
            if recomputed is not None:
                recompute_frac = recomputed / queries
        elif queries is not None:
            hit = None  # nothing was queried: no evidence either way
        return hit, recompute_frac, bool(preemptions)

    def _decide(self, action: str, reason: str, sample: CacheSample | None = None,
                hit: float | None = None) -> Decision:
        s = self._s
        admitted = self._fill()
        return Decision(
            window=s.window, action=action, reason=reason, active=len(s.active), held=len(s.held),
            usage=None if sample is None else sample.usage, hit_rate=hit, hit_ewma=s.hit_ewma, admitted=admitted,
        )

    # -- state that survives a pause -----------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain JSON data: a paused and resumed job restores its controller from it."""
        s = self._s
        return {
            "window": s.window, "slow_start": s.slow_start, "active": list(s.active), "held": list(s.held),
            "hit_ewma": s.hit_ewma, "last_decrease": s.last_decrease, "paused": sorted(s.paused),
            "last_resume": s.last_resume, "tokens": dict(s.tokens),
            "cache": None if s.cache is None else list(s.cache),
            "previous": None if s.previous is None else asdict(s.previous),
        }

    def _load(self, state: dict[str, Any]) -> None:
        window = int(state["window"])
        if not self.config.w_min <= window <= self.config.w_max:
            raise ValueError(f"window: {window} lies outside [w_min, w_max]")
        previous = state.get("previous")
        self._s = _State(
            window=window, slow_start=bool(state.get("slow_start", False)),
            active=[str(a) for a in state.get("active", [])], held=deque(str(a) for a in state.get("held", [])),
            hit_ewma=state.get("hit_ewma"), last_decrease=state.get("last_decrease"),
            paused={str(a) for a in state.get("paused", [])}, last_resume=state.get("last_resume"),
            tokens={str(a): int(n) for a, n in state.get("tokens", {}).items()},
            cache=None if state.get("cache") is None else (float(state["cache"][0]), float(state["cache"][1])),
            previous=None if previous is None else CacheSample(**previous),
        )
