"""What an engine step costs on the virtual clock of an agentic batch (`agents`).

``MeasuredClock`` charges each step the CPU time of this thread during it
(``time.thread_time``; torch runs in this thread with one intra-op thread), so the other
processes of a contended machine do not stretch it. With ``record`` it also keeps each
step's work and cost: what ``rota.bench.fitted_clock`` fits its model to, for benchmarks
that need every arm to pay the same price for the same work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from rota.jobkit.inference.engine import Engine, Finished

__all__ = ["MeasuredClock", "StepClock", "work_features"]


class StepClock(Protocol):
    def step(self, engine: Engine) -> tuple[list[Finished], float]: ...


@dataclass
class MeasuredClock:
    record: bool = False
    samples: list[tuple[tuple[int, ...], float]] = field(default_factory=list)

    def step(self, engine: Engine) -> tuple[list[Finished], float]:
        started = time.thread_time()
        out = engine.step()
        cost = time.thread_time() - started
        if self.record and engine.last_work[0]:
            self.samples.append((work_features(engine.last_work), cost))
        return out, cost


def work_features(work: tuple[int, int, int, int, int]) -> tuple[int, ...]:
    """The engine's (tokens, decodes, decode context, prefill pairs, chunks) as the model's
    inputs: the counts of decodes and chunks follow the tokens too closely to be fitted apart."""
    tokens, _, decode_context, pairs, _ = work
    return (tokens, decode_context, pairs)
