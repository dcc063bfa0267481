"""Hydro bench, fidelity and fusion sections: do surrogates rank like the full model, and how fast are fused trials?

Task: the byte-level TinyLM on the Python standard library's sources. Every configuration
trains on the same batches from the same initial seed; its figure is the held-out loss after
the budget. Full-scale (S = 1) and surrogate trials run one at a time (that also gives the
"plain" and "scaled" times); the fused arm trains all surrogate configurations as one batch.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from rota.bench.kendall import kendall_tau
from rota.jobkit.tuning.fused import FusedTrials, TrialHparams
from rota.jobkit.tuning.lm import Batches, TinyLM, stdlib_batches
from rota.jobkit.tuning.scaling import scale_width


@dataclass(frozen=True)
class Setup:
    width: int = 64
    layers: int = 2
    heads: int = 2
    context: int = 32
    batch: int = 8
    steps: int = 150
    configs: int = 12
    seed: int = 0

    def model(self) -> TinyLM:
        return TinyLM(width=self.width, layers=self.layers, heads=self.heads, context=self.context)

    def data(self) -> Batches:
        return stdlib_batches(seed=self.seed, batch=self.batch, context=self.context, max_bytes=1_000_000)


def sample_configs(n: int, seed: int) -> list[TrialHparams]:
    """Random configurations over the two muP-transferable knobs: learning rate and readout multiplier."""
    rng = random.Random(seed)
    return [TrialHparams(lr=10 ** rng.uniform(-3.3, -0.8), output_mult=2 ** rng.uniform(-3, 2)) for _ in range(n)]


@dataclass(frozen=True)
class TrainTiming:
    """One fused (or single) training run's wall time, split: the step loop apart from its setup."""

    step_s: float  # the training steps alone
    setup_s: float  # model build, data reading, held-out batch, and the final evaluation


def train_timed(setup: Setup, factor: int, configs: list[TrialHparams]) -> tuple[list[float], TrainTiming]:
    """Train configurations as one fused batch; their held-out losses and the time, step loop apart."""
    began = time.perf_counter()
    base = setup.model()
    models = [scale_width(base, factor, seed=setup.seed) for _ in configs]
    fused = FusedTrials(models, configs)
    data = setup.data()
    held_out = data.eval_batch()
    started = time.perf_counter()
    for _ in range(setup.steps):
        fused.step(data.next())
    ended = time.perf_counter()
    losses = [v if math.isfinite(v) else float("inf") for v in fused.evaluate(held_out)]
    setup_s = (started - began) + (time.perf_counter() - ended)
    return losses, TrainTiming(step_s=ended - started, setup_s=setup_s)


def train(setup: Setup, factor: int, configs: list[TrialHparams]) -> tuple[list[float], float]:
    """Train configurations as one fused batch; their held-out losses and the step loop's wall time."""
    losses, timing = train_timed(setup, factor, configs)
    return losses, timing.step_s


def _finite(losses: list[float]) -> list[float]:
    # A diverged configuration ranks last; tau needs finite numbers.
    worst = max((v for v in losses if math.isfinite(v)), default=0.0)
    return [v if math.isfinite(v) else worst + 1.0 for v in losses]


def fidelity(setup: Setup) -> dict[str, object]:
    configs = sample_configs(setup.configs, setup.seed)
    full, full_times = [], []
    for config in configs:  # plain trials, one at a time
        losses, elapsed = train(setup, 1, [config])
        full.append(losses[0])
        full_times.append(elapsed)
    scaled: dict[int, list[float]] = {}
    scaled_time = 0.0
    for config in configs:  # scaled trials (S = 4), one at a time
        losses, elapsed = train(setup, 4, [config])
        scaled.setdefault(4, []).append(losses[0])
        scaled_time += elapsed
    fused4, fused_time = train(setup, 4, configs)
    scaled[8], _ = train(setup, 8, configs)
    target = min(full) * 1.02
    plain_time: float | None = None
    spent = 0.0
    for loss, elapsed in zip(full, full_times, strict=True):
        spent += elapsed
        if loss <= target:
            plain_time = spent
            break

    def with_transfer(search_s: float, surrogate: list[float]) -> float | None:
        best = min(range(len(surrogate)), key=lambda i: surrogate[i])
        # Eager transfer at the end of the search: the chosen configuration runs at full scale.
        return search_s + full_times[best] if full[best] <= target else None

    return {
        "tau_s4": kendall_tau(_finite(full), _finite(scaled[4])),
        "tau_s8": kendall_tau(_finite(full), _finite(scaled[8])),
        "tau_s4_fused": kendall_tau(_finite(full), _finite(fused4)),
        "configs": len(configs),
        "steps": setup.steps,
        "time_to_target_s": {"plain": plain_time, "scaled": with_transfer(scaled_time, scaled[4]),
                             "fused": with_transfer(fused_time, fused4)},
        "losses": {"s1": full, "s4": scaled[4], "s8": scaled[8]},
        "configs_hparams": [{"lr": c.lr, "output_mult": c.output_mult} for c in configs],
    }


def _trial_batch(setup: Setup, factor: int, count: int, steps: int) -> TrainTiming:
    torch.set_num_threads(1)
    configs = sample_configs(count, setup.seed)
    return train_timed(Setup(**{**setup.__dict__, "steps": steps}), factor, configs)[1]


def _sequential_worker(setup: Setup, factor: int, count: int, steps: int, out: Any = None) -> TrainTiming:
    step_s = setup_s = 0.0
    for i in range(count):
        timing = _trial_batch(Setup(**{**setup.__dict__, "seed": setup.seed + i}), factor, 1, steps)
        step_s += timing.step_s
        setup_s += timing.setup_s
    total = TrainTiming(step_s=step_s, setup_s=setup_s)
    if out is not None:  # a spawned process hands its split back to the parent
        out.put((total.step_s, total.setup_s))
    return total


def _processes_round(setup: Setup, factor: int, steps: int) -> tuple[TrainTiming, float]:
    """Two processes of two trials each: (step loops, setup) of the slower process, and the wall time."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_sequential_worker, args=(setup, factor, 2, steps, queue)) for _ in range(2)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    splits = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - started
    # The processes run side by side: the arm's step time is the slower one's step loops.
    step_s, setup_s = max(splits)
    return TrainTiming(step_s=step_s, setup_s=setup_s), wall


def _summary(samples: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, list[float]]]:
    return ({arm: statistics.median(v) for arm, v in samples.items()},
            {arm: [min(v), max(v)] for arm, v in samples.items()})


def fusion(setup: Setup, steps: int = 20, factor: int = 4, repeats: int = 3) -> dict[str, object]:
    """Trials per second (a trial = ``steps`` surrogate steps): one at a time, two processes,
    fused; each arm ``repeats`` times in interleaved rounds (one of each per round, so drifting
    load on shared cores falls on every arm alike), the median with the min and max.

    ``trials_per_s`` counts the step loops only, in every arm: one at a time pays model build,
    data reading and evaluation per trial where a fused batch pays them once, and that is setup,
    not step speed. The setup (``setup_s``) and the whole wall time (``wall_trials_per_s``,
    process start-up included for the processes arm) are reported apart."""
    rates: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    setups: dict[str, list[float]] = {}

    def record(arm: str, trials: int, timing: TrainTiming, wall: float) -> None:
        rates.setdefault(arm, []).append(trials / timing.step_s)
        walls.setdefault(arm, []).append(trials / wall)
        setups.setdefault(arm, []).append(timing.setup_s)

    for _ in range(repeats):
        started = time.perf_counter()
        timing = _sequential_worker(setup, factor, 4, steps)
        record("sequential", 4, timing, time.perf_counter() - started)
        timing, wall = _processes_round(setup, factor, steps)
        record("processes", 4, timing, wall)
        for count in (4, 8, 16):
            started = time.perf_counter()
            timing = _trial_batch(setup, factor, count, steps)
            record(f"fused_{count}", count, timing, time.perf_counter() - started)
    median, ranges = _summary(rates)
    wall_median, wall_ranges = _summary(walls)
    return {"trials_per_s": median, "trials_per_s_range": ranges,
            "repeats": repeats, "steps_per_trial": steps, "scale": factor,
            "fused_8_vs_sequential": median["fused_8"] / median["sequential"],
            "setup_s": _summary(setups)[0], "wall_trials_per_s": wall_median,
            "wall_trials_per_s_range": wall_ranges,
            "wall_fused_8_vs_sequential": wall_median["fused_8"] / wall_median["sequential"]}
