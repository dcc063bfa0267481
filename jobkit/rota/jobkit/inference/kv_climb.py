"""An admission window that searches for its size online: a hill-climb over the number of
active agents driven by measured goodput, with congestion as a fast back-off. Pure logic,
like `rota.jobkit.inference.kv_window`, whose agent bookkeeping (``request``/``release``, agents
held and admitted at step boundaries, an agent admitted only where its next turn fits in the
cache) it keeps; only the control law differs. The law below moves the window; the cache's
size bounds admissions beside it, and the climb measures and probes only while the window's
own slots are full (``window_binds``): agents that wait for room in the cache say nothing of
the window.

Why a search: the best window of an agentic batch depends on the agents' count, their
turn lengths and the cache's size, and thresholds chosen on some shapes miss on others
(and engines disagree on what their counters mean: vLLM counts the cached blocks of agents
in their tool calls as free, so its usage never looks full). Goodput (generated tokens per
second, from the engine's ``generation_tokens`` counter) is what the window is for, and it
is measured the same way on every engine.

The law, per control interval:

- **fast back-off**: the engine preempted a request, or live agents' prefixes were
  recomputed (more than ``recompute_tolerance`` of the interval's queried tokens, where the
  engine counts recompute): the window is cut to ``floor(W * backoff)``, at most once per
  ``cooldown_s``. Recompute while agents this controller paused are in their first turn
  back is the price of a cut (their histories were evicted while they waited), not
  congestion, and cuts nothing. After a cut the climb starts again from a baseline and
  probes up by one per epoch (additive increase, each step checked by goodput);
- **a queue the cache cannot take** (``queue_samples`` scrapes in a row): the requests
  waiting in the engine's queue (``vllm:num_requests_waiting``) need, at the running
  requests' mean context (``usage / running``), more than the free cache
  (``waiting * usage / running > 1 - usage``). An engine short of room queues requests
  rather than preempting (vLLM admits a waiting request only when its blocks fit, and its
  token budget per step admits only a few long prompts at once), so a window beyond what
  fits shows no preemption and, on vLLM, no recompute counter: only a queue that the free
  cache cannot drain, while the prefixes of agents in their tool calls are evicted to make
  room for it. The bar is the cache's own mean context, not a tuned usage level: a queue
  that fits in the free room (an ample cache, a short wait for the step's budget) is not
  congestion. It marks the cache as binding, as a preemption does, and the window goes
  straight to the fit bound below (no multiplicative cut: requests submitted before the
  cut stay queued until they drain, so the queue would go on cutting below what fits);
- otherwise, while agents are held (the window binds), the interval's generated tokens and
  seconds add to the current **epoch**, which ends after ``epoch_intervals`` intervals once
  ``epoch_tokens_per_agent * W`` tokens were generated in it (a slow engine's epochs last
  longer). Its goodput is compared with the previous epoch's: no worse (within
  ``tolerance``): the climb goes on the same way (doubling in slow start, the first moves
  up from ``w_init``; the first doubling comes after one interval, since it compares
  nothing); worse: back to the previous window, with half the step. An epoch
  measured where the climb went back to probes down if goodput fell there too (the batch
  drifted: histories grow), else up. While no agent waits for a slot of the window (none
  is held, or only the cache holds them) the window holds: goodput then says nothing about it.

Agents a shrink takes the slot from (they give it up at their next step boundary) are
resumed before agents that never ran: their histories may still be cached, and they are
nearer their end. Nothing here reads a clock; ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig, Decision

__all__ = ["ClimbConfig", "GoodputClimb", "queue_binds"]


@dataclass(frozen=True)
class ClimbConfig:
    epoch_intervals: int = 2
    tolerance: float = 0.05
    backoff: float = 0.7
    max_step_fraction: float = 0.5  # a climb step is at most this fraction of the window (and at least 1)
    epoch_tokens_per_agent: float = 4.0  # an epoch also lasts until W * this many tokens were generated
    # > 0: once the cache was seen to bind, the window stays within this many times the agents
    # whose current contexts fit (``GoodputClimb.fit``); 0: no such bound
    fit_headroom: float = 0.0
    fit_samples: int = 2  # scrapes that estimate the fit (a ratio of their sums)
    # scrapes in a row that must show a queue the free cache cannot take before that is
    # congestion (`queue_binds`); 0: the queue is not read
    queue_samples: int = 1
    # once the cache was seen to bind, an active agent counts in the cache at least what
    # finished agents' last turns held on average (their history grows toward it), and the
    # window shrinks at a step boundary where the active agents' turns so counted no longer fit
    size_from_finished: bool = True

    def __post_init__(self) -> None:
        if self.epoch_intervals < 1:
            raise ValueError(f"epoch_intervals: must be at least 1, got {self.epoch_intervals}")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"tolerance: must lie in [0, 1), got {self.tolerance}")
        if not 0.0 < self.backoff < 1.0:
            raise ValueError(f"backoff: must lie in (0, 1), got {self.backoff}")
        if self.epoch_tokens_per_agent < 0:
            raise ValueError(f"epoch_tokens_per_agent: must not be negative, got {self.epoch_tokens_per_agent}")
        if self.fit_headroom < 0:
            raise ValueError(f"fit_headroom: must not be negative, got {self.fit_headroom}")
        if self.fit_samples < 1:
            raise ValueError(f"fit_samples: must be at least 1, got {self.fit_samples}")
        if self.queue_samples < 0:
            raise ValueError(f"queue_samples: must not be negative, got {self.queue_samples}")
        if not 0.0 < self.max_step_fraction <= 1.0:
            raise ValueError(f"max_step_fraction: must lie in (0, 1], got {self.max_step_fraction}")


@dataclass
class _Climb:
    direction: int = 1
    step: int = 0  # 0: slow start (double)
    tokens: float = 0.0
    seconds: float = 0.0
    intervals: int = 0
    last_goodput: float | None = None  # the previous epoch's, at last_window
    last_window: int | None = None
    last_now: float | None = None
    fit: deque[tuple[float, float]] = field(default_factory=deque)  # recent scrapes' (running, usage)
    congested: bool = False  # a preemption, a live agent's recompute or a queue the cache cannot take was seen
    queued: int = 0  # scrapes in a row that showed a queue the cache cannot take
    finished: int = 0  # agents released, and the tokens of their last turns
    finished_tokens: int = 0


def queue_binds(sample: CacheSample) -> bool:
    """The requests waiting in the engine's queue need, at the running requests' mean
    context (``usage / running``), more room than the cache has free."""
    running, waiting = sample.running, sample.waiting
    if running is None or waiting is None or running < 1 or waiting < 1:
        return False
    return waiting * sample.usage / running > 1.0 - sample.usage


class GoodputClimb(AdmissionController):
    """``AdmissionController``'s agents and window, moved by a goodput hill-climb."""

    def __init__(self, config: ControllerConfig, climb: ClimbConfig | None = None,
                 state: dict[str, Any] | None = None) -> None:
        super().__init__(config, state)
        self.climb = climb or ClimbConfig()
        self._c = _Climb(fit=deque(maxlen=self.climb.fit_samples))
        self._recovering: set[str] = set()  # resumed after a pause, their first turn back not yet done

    def request(self, agent: str, tokens: int | None = None) -> bool:
        s = self._s
        self._note(agent, tokens)
        self._recovering.discard(agent)  # a step boundary: its turn back (and its recompute) is done
        if agent in s.active and self._outgrown():
            # this agent gives its slot up: the window is one fewer than the active agents, even
            # where a cut had set it lower, so that one agent pauses per step boundary rather
            # than all that a deeper cut asks at once (never raising it measured worse:
            # bench/concur/README.md, "Tried and dropped")
            s.window = max(self.config.w_min, len(s.active) - 1)
        if agent in s.active and len(s.active) > s.window and self.config.pause_on_shrink:
            s.active.remove(agent)
            ahead = next((i for i, a in enumerate(s.held) if a not in s.paused), len(s.held))
            s.held.insert(ahead, agent)  # resumed before agents that never ran: its history may still be cached
            s.paused.add(agent)
            return False
        return super().request(agent)  # its tokens are noted above

    def release(self, agent: str) -> tuple[str, ...]:
        self._recovering.discard(agent)
        last = self._s.tokens.get(agent)
        if last is not None and agent in self._s.active:
            self._c.finished += 1
            self._c.finished_tokens += last
        return super().release(agent)

    def _excused(self, agent: str) -> bool:
        return agent in self._recovering or super()._excused(agent)

    def _blocks(self, agent: str, per_block: float) -> int:
        """An active agent's turn in the cache; once the cache binds, at least what finished
        agents' last turns held on average: histories grow, and a window that fits today's
        sizes is outgrown by the next turns (`size_from_finished`)."""
        tokens = self._s.tokens.get(agent, 0)
        k = self._c
        if self.climb.size_from_finished and k.congested and k.finished:
            tokens = max(tokens, k.finished_tokens // k.finished)
        return math.ceil(tokens / per_block)

    def _outgrown(self) -> bool:
        """Once the cache binds: the active agents' turns, counted as ``_blocks`` does, no
        longer fit in the cache together."""
        s = self._s
        if not (self.climb.size_from_finished and self._c.congested and s.cache and len(s.active) > 1
                and self.config.admit_within_cache):
            return False
        blocks, per_block = s.cache
        return self._active_blocks(per_block) > blocks

    def _fill(self) -> tuple[str, ...]:
        paused = set(self._s.paused)
        admitted = super()._fill()
        self._recovering.update(a for a in admitted if a in paused)
        return admitted

    def observe(self, sample: CacheSample | None, now: float) -> Decision:
        s, c, k = self._s, self.config, self._c
        if sample is None:
            return self._no_signal(now)
        sample = self._with_served(sample)
        previous = self._accept(sample, now)
        self._track_fit(sample)
        elapsed = 0.0 if k.last_now is None else max(0.0, now - k.last_now)
        k.last_now = now
        hit, recompute_frac, preempted = self._interval(previous, sample)
        evicted_live = recompute_frac is not None and recompute_frac > c.recompute_tolerance
        if evicted_live and self._recovering:
            evicted_live = False  # the price of a cut, paid by agents it paused, now resumed
        queued = self._track_queue(sample)
        if preempted or evicted_live:
            why = ("the engine preempted requests" if preempted else
                   f"live agents' prefixes recomputed ({recompute_frac:.0%} of queried tokens)")
            return self._back_off(now, why, sample, hit)
        k.congested = k.congested or queued
        cap = self._ceiling()
        if k.congested and cap is not None and cap < s.window:
            # histories grow between turns: shrink before they are evicted, not after. No
            # cool-down: this reads the cache's occupancy now, not one event seen twice
            s.window, s.last_decrease = cap, now
            self._restart()
            why = (f"{sample.waiting:.0f} requests queued, {sample.running:.0f} running at usage {sample.usage:.0%}: "
                   if queued else "contexts outgrow the cache: ")
            return self._decide("decrease", f"{why}{self.fit():.1f} agents fit", sample, hit)
        before = None if previous is None else previous.generated
        generated = None if sample.generated is None or before is None or sample.generated < before \
            else sample.generated - before
        binding = self.window_binds()  # agents wait for a slot: the window limits goodput
        if generated is None or not binding or elapsed <= 0.0:
            return self._decide("hold", "window not binding" if not binding else "no goodput yet", sample, hit)
        k.tokens += generated
        k.seconds += elapsed
        k.intervals += 1
        starting = k.step == 0 and k.last_goodput is None  # the first probe compares nothing: no need to wait
        if not starting and (k.intervals < self.climb.epoch_intervals
                             or k.tokens < self.climb.epoch_tokens_per_agent * s.window):
            return self._decide("hold", "measuring goodput", sample, hit)
        return self._epoch(sample, hit)

    def _track_fit(self, sample: CacheSample) -> None:
        if sample.running is not None and sample.running > 0 and sample.usage > 0:
            self._c.fit.append((sample.running, sample.usage))

    def _track_queue(self, sample: CacheSample) -> bool:
        """Whether ``queue_samples`` scrapes in a row (this one the last) showed a queue the
        free cache cannot take."""
        k = self._c
        k.queued = k.queued + 1 if queue_binds(sample) else 0
        return self.climb.queue_samples > 0 and k.queued >= self.climb.queue_samples

    def fit(self) -> float | None:
        """How many agents' current contexts the whole cache holds: requests running per unit
        of usage (usage counts the blocks of running requests alone, on vLLM and here), over
        the last ``fit_samples`` scrapes; None before a scrape with both."""
        usage = sum(u for _, u in self._c.fit)
        return sum(r for r, _ in self._c.fit) / usage if usage > 0 else None

    def _restart(self) -> None:
        """A new baseline epoch, probing up by one agent at a time."""
        k = self._c
        k.direction, k.step = 1, 1
        k.tokens = k.seconds = 0.0
        k.intervals = 0
        k.last_goodput = k.last_window = None

    def _ceiling(self) -> int | None:
        fit = self.fit()
        if self.climb.fit_headroom <= 0 or fit is None:
            return None
        return max(self.config.w_min, math.floor(self.climb.fit_headroom * fit))

    def _epoch(self, sample: CacheSample, hit: float | None) -> Decision:
        s, k, cl = self._s, self._c, self.climb
        goodput = k.tokens / k.seconds
        k.tokens = k.seconds = 0.0
        k.intervals = 0
        before, at = k.last_goodput, k.last_window
        k.last_goodput, k.last_window = goodput, s.window
        if before is None or at is None:  # a baseline (start, or after a back-off): probe up
            return self._move(1, sample, hit, f"goodput {goodput:.1f}/s at W={s.window}: probe up")
        if at == s.window:  # re-measured where it went back to: down if goodput fell there, else up
            fell = goodput < before * (1 - cl.tolerance)
            return self._move(-1 if fell else 1, sample, hit,
                              f"goodput {goodput:.1f}/s at W={at}, was {before:.1f}: probe {'down' if fell else 'up'}")
        if goodput >= before * (1 - cl.tolerance):  # no worse: go on the same way
            return self._move(k.direction, sample, hit, f"goodput {goodput:.1f}/s, {before:.1f} at W={at}: on")
        k.step = max(1, (k.step or abs(s.window - at)) // 2)  # worse: back, by a smaller step next time
        k.last_goodput, k.last_window = before, at
        action = "decrease" if at < s.window else "increase"
        s.window = at
        return self._decide(action, f"goodput {goodput:.1f}/s, down from {before:.1f} at W={at}: back", sample, hit)

    def _move(self, direction: int, sample: CacheSample, hit: float | None, why: str) -> Decision:
        s, c, k = self._s, self.config, self._c
        k.direction = direction
        if k.step == 0:
            target = s.window * 2 if direction > 0 else s.window // 2
        else:
            target = s.window + direction * max(1, min(k.step, math.floor(s.window * self.climb.max_step_fraction)))
        target = max(c.w_min, min(c.w_max, target))
        cap = self._ceiling()
        if k.congested and cap is not None:
            if direction > 0:  # a probe up stops at the fit
                target = max(min(s.window, target), min(target, cap))
            else:  # and one down stops there too: below what fits, fewer agents cannot relieve the
                target = min(s.window, max(target, cap))  # cache, and goodput falls as the batch drains
        if direction > 0 and not self.window_binds():
            return self._decide("hold", f"{why}; window not binding", sample, None)
        action = "increase" if target > s.window else "decrease" if target < s.window else "hold"
        s.window = target
        return self._decide(action, why, sample, hit)

    def _back_off(self, now: float, why: str, sample: CacheSample, hit: float | None) -> Decision:
        s, c = self._s, self.config
        if (ago := self._within_cooldown(now)) is not None:
            return self._decide("hold", f"{why}; cut {ago:.1f}s ago", sample, hit)
        # where the cache, not the window, holds agents back, the cut is from the agents active
        base = len(s.active) if s.held and len(s.active) < s.window else s.window
        target = math.floor(base * self.climb.backoff)
        cap = self._ceiling()
        if cap is not None:  # straight to what fits, not 0.7x per cool-down
            target = min(target, cap)
        s.window = max(c.w_min, target)
        s.last_decrease = now
        self._c.congested = True
        self._restart()  # additive probes up from here, each checked by goodput
        return self._decide("decrease", why, sample, hit)
