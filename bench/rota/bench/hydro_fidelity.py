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


def train(setup: Setup, factor: int, configs: list[TrialHparams]) -> tuple[list[float], float]:
    """Train configurations as one fused batch; their held-out losses and the wall time."""
    base = setup.model()
    models = [scale_width(base, factor, seed=setup.seed) for _ in configs]
    fused = FusedTrials(models, configs)
    data = setup.data()
    held_out = data.eval_batch()
    started = time.perf_counter()
    for _ in range(setup.steps):
        fused.step(data.next())
    elapsed = time.perf_counter() - started
    losses = [v if math.isfinite(v) else float("inf") for v in fused.evaluate(held_out)]
    return losses, elapsed


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


def _trial_batch(setup: Setup, factor: int, count: int, steps: int) -> None:
    torch.set_num_threads(1)
    configs = sample_configs(count, setup.seed)
    train(Setup(**{**setup.__dict__, "steps": steps}), factor, configs)


def _sequential_worker(setup: Setup, factor: int, count: int, steps: int) -> None:
    for i in range(count):
        _trial_batch(Setup(**{**setup.__dict__, "seed": setup.seed + i}), factor, 1, steps)


def fusion(setup: Setup, steps: int = 20, factor: int = 4, repeats: int = 3) -> dict[str, object]:
    """Trials per second (a trial = ``steps`` surrogate steps): one at a time, two processes,
    fused; each arm ``repeats`` times in interleaved rounds (one of each per round, so drifting
    load on shared cores falls on every arm alike), the median with the min and max."""
    samples: dict[str, list[float]] = {}
    ctx = mp.get_context("spawn")
    for _ in range(repeats):
        started = time.perf_counter()
        _sequential_worker(setup, factor, 4, steps)
        samples.setdefault("sequential", []).append(4 / (time.perf_counter() - started))
        procs = [ctx.Process(target=_sequential_worker, args=(setup, factor, 2, steps)) for _ in range(2)]
        started = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        # Process start-up (spawn + imports) is part of what separate processes cost.
        samples.setdefault("processes", []).append(4 / (time.perf_counter() - started))
        for count in (4, 8, 16):
            started = time.perf_counter()
            _trial_batch(setup, factor, count, steps)
            samples.setdefault(f"fused_{count}", []).append(count / (time.perf_counter() - started))
    rates = {arm: statistics.median(values) for arm, values in samples.items()}
    return {"trials_per_s": rates, "trials_per_s_range": {arm: [min(v), max(v)] for arm, v in samples.items()},
            "repeats": repeats, "steps_per_trial": steps, "scale": factor,
            "fused_8_vs_sequential": rates["fused_8"] / rates["sequential"]}
