"""Synthetic completed jobs for the forecaster's benchmark (pure, seeded).

No public data set pairs fine-tuning jobs' features with their durations, so jobs are
generated, and only their *durations* and GPU counts are real:

- **GPU count**: a real Philly job's (`philly_vc_arrivals_gavel.csv`, rounded up to a
  power of two, at most 64).
- **Duration**: drawn like `rota.sim.traces` does: a real run time of a passed multi-GPU
  Philly job of the same size (`philly_multigpu_pass.csv`), or for 1-GPU jobs Philly's
  log-normal (median 874 s, mean 18,006 s; `acme_cluster_summary.csv`) conditioned on
  at least 10 minutes, the multi-GPU file's own cut.
- **Features** are drawn from the mixes below (choices, not data), then `tokens` is
  solved so that the *true* model gives that duration. The true model is the physical
  prior with different, hidden constants (lower MFU, slower storage, worse scaling
  across nodes, a per-GPU-type efficiency, smaller models and micro-batches less
  efficient) times noise: log-normal for data and node variation (σ 0.10 for SFT and
  CPT, 0.12 for DPO, 0.25 for RL, whose rollouts vary in length), and a heavy
  tail (6% of jobs, Pareto α 2.5 from ×1.1, at most ×5) for stragglers and restarts.
  So the generated durations follow the real distribution, and how they relate to the
  features is physical but unknown to the prior.
- **Declared durations** model what users write in `duration:`: an optimistic guess
  (the true duration times a log-normal factor, median 0.7, σ 0.5) rounded to the
  nearest round figure (10 min, 1 h, 8 h, 2 days, ...).
- **Quantization** jobs have no trace at all: sizes, algorithms and GPU types are drawn,
  and durations come from a hidden true model anchored on published figures (GPTQ:
  about 4 GPU-hours for 175B on an A100; AWQ about 10 min for 7B), with the same noise.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, replace

from rota.core.forecasting import prior
from rota.core.forecasting.features import QuantFeatures, TrainingFeatures
from rota.core.forecasting.prior import GPU_TYPES, TrainingConstants

TRUTH = TrainingConstants(
    mfu_full=0.34, mfu_lora=0.22, quantized_base=0.5, decode_mfu=0.03, scale_in_node=0.93,
    scale_across=0.78, tp_cost=0.88, no_flash=0.7, padding=0.6, zero3=0.85, ppo_overhead=1.25,
    startup_s=240.0, load_gbps=1.0, save_gbps=0.5,
)
GPU_EFFICIENCY = {"v100": 1.05, "a10g": 0.9, "l40s": 0.85, "a100-40gb": 1.0, "a100-80gb": 1.0,
                  "h100": 0.8, "h200": 0.85, "cpu": 1.0}
NOISE_SIGMA = {"sft": 0.10, "cpt": 0.10, "dpo": 0.12, "rlhf": 0.25, "rlvr": 0.25, "quantization": 0.15}
TAIL_P, TAIL_ALPHA, TAIL_MIN, TAIL_MAX = 0.06, 2.5, 1.1, 5.0
MIN_RUN_S = 600.0

VARIANT_MIX = {"lora-sft": 30, "full-sft": 15, "lora-dpo": 10, "full-dpo": 5, "lora-rlhf": 4, "full-rlhf": 4,
               "lora-rlvr": 6, "full-rlvr": 6, "lora-cpt": 5, "full-cpt": 15}
GPU_MIX = {"a100-80gb": 35, "h100": 25, "a100-40gb": 15, "h200": 8, "l40s": 7, "v100": 6, "a10g": 4}
SIZES_B = (0.125, 0.35, 0.5, 1.1, 1.5, 3, 7, 8, 13, 14, 32, 34, 70, 180, 405)
NICE_S = (300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 28800, 43200, 86400, 172800,
          259200, 604800, 1209600, 2592000)
OPTIMISM_MEDIAN, OPTIMISM_SIGMA = 0.7, 0.5


@dataclass(frozen=True)
class Synthetic:
    kind: str  # training | quantization
    features: TrainingFeatures | QuantFeatures
    expected_s: float  # the true model without noise
    actual_s: float
    declared_s: float

    @property
    def gpus(self) -> int:
        return self.features.gpus


def noise(rng: random.Random, sigma: float) -> float:
    factor = math.exp(rng.gauss(0.0, sigma))
    if rng.random() < TAIL_P:
        factor *= min(TAIL_MAX, TAIL_MIN * rng.random() ** (-1 / TAIL_ALPHA))
    return factor


def declared(expected_s: float, rng: random.Random) -> float:
    guess = expected_s * OPTIMISM_MEDIAN * math.exp(rng.gauss(0.0, OPTIMISM_SIGMA))
    i = bisect.bisect_left(NICE_S, guess)
    near = [NICE_S[j] for j in (i - 1, i) if 0 <= j < len(NICE_S)]
    return float(min(near, key=lambda n: abs(math.log(n / guess))))


def true_training_seconds(f: TrainingFeatures) -> float:
    k = GPU_EFFICIENCY[f.gpu_type] * min(1.2, (f.params / 7e9) ** 0.06) * (f.micro_batch / 4) ** 0.08
    k *= (f.seq_len / 2048) ** 0.04
    return prior.training_seconds(f, replace(TRUTH, mfu_full=TRUTH.mfu_full * k, mfu_lora=TRUTH.mfu_lora * k))


def _pick(rng: random.Random, mix: dict[str, int]) -> str:
    return rng.choices(list(mix), list(mix.values()))[0]


def _fits(method: str, quant_bits: int, params: float, gpus: int, memory_gb: float) -> int | None:
    """The ZeRO stage that fits the weights and optimizer state in 80% of memory, or None."""
    if method == "lora":
        return 0 if params * quant_bits / 8 / 1e9 <= 0.8 * memory_gb else (3 if params * 2 / 1e9 / gpus <= 0.8 * memory_gb and gpus > 1 else None)
    for stage, per_param in ((0, 16.0), (2, 4.0 + 12.0 / gpus), (3, 16.0 / gpus)):
        if (stage == 0 or gpus > 1) and params * per_param / 1e9 <= 0.8 * memory_gb:
            return stage
    return None


def _draw_shape(rng: random.Random, gpus: int) -> TrainingFeatures:
    """Every feature but the token count (set to 1; `solve_tokens` sets it)."""
    method, objective = _pick(rng, VARIANT_MIX).split("-")
    gpu_type = _pick(rng, GPU_MIX)
    quant_bits = 4 if method == "lora" and rng.random() < 0.25 else 16
    fitting = [(b, s) for b in SIZES_B if (s := _fits(method, quant_bits, b * 1e9, gpus, GPU_TYPES[gpu_type].memory_gb)) is not None]
    if not fitting:
        return _draw_shape(rng, gpus)
    size_b, zero = rng.choice(fitting)
    precision = "fp16" if gpu_type == "v100" else rng.choices(["bf16", "fp8", "fp32"], [85, 10, 5])[0]
    if precision == "fp8" and gpu_type not in ("h100", "h200", "l40s"):
        precision = "bf16"
    micro = rng.choice([1, 2, 4, 8])
    rl = objective in ("rlhf", "rlvr")
    return TrainingFeatures(
        method=method, objective=objective, params=size_b * 1e9, tokens=1.0,
        epochs=float(rng.choice([1, 1, 1, 2, 3])), seq_len=rng.choices([512, 1024, 2048, 4096, 8192], [10, 20, 35, 25, 10])[0],
        batch_size=gpus * micro * rng.choice([1, 2, 4, 8]), micro_batch=micro, gpus=gpus, gpu_type=gpu_type,
        precision=precision, lora_rank=rng.choice([8, 16, 32, 64]), quant_bits=quant_bits,
        grad_checkpointing=rng.random() < 0.4, zero_stage=zero, tensor_parallel=1, pipeline_parallel=1,
        flash_attention=gpu_type != "v100" and rng.random() < 0.9, packing=rng.random() < 0.7,
        rollout_fraction=rng.uniform(0.3, 0.8) if rl else 0.0,
        reward_params=size_b * 1e9 * rng.choice([1.0, 0.5, 0.1]) if objective == "rlhf" else 0.0,
        eval_fraction=0.0 if rng.random() < 0.6 else rng.uniform(0.01, 0.1),
        checkpoint_interval=0 if rng.random() < 0.3 else rng.choice([100, 500, 1000]),
    )


def solve_tokens(shape: TrainingFeatures, expected_s: float) -> TrainingFeatures | None:
    """The job of this shape whose true duration is `expected_s` (tokens to 2 figures), or None."""
    def with_total(total: float) -> TrainingFeatures:
        return replace(shape, tokens=total / shape.epochs)

    lo, hi = 1e5, 1e6
    d_lo, d_hi = true_training_seconds(with_total(lo)), true_training_seconds(with_total(hi))
    if expected_s <= d_lo:
        return None
    total = lo + (expected_s - d_lo) * (hi - lo) / (d_hi - d_lo)
    for _ in range(3):  # checkpoint counts make it piecewise: refine by the secant
        d = true_training_seconds(with_total(total))
        if abs(d / expected_s - 1) < 1e-3:
            break
        total = max(lo, total * (expected_s - d_lo) / max(d - d_lo, 1e-9))
    total = float(f"{total:.2g}")
    return with_total(total) if total <= 1e14 else None


def training_job(rng: random.Random, gpus: int, actual_s: float) -> Synthetic:
    """A training job on `gpus` GPUs that actually ran for `actual_s` seconds."""
    for _ in range(200):
        shape = _draw_shape(rng, gpus)
        factor = noise(rng, NOISE_SIGMA[shape.objective])
        f = solve_tokens(shape, actual_s / factor)
        if f is not None:
            expected = true_training_seconds(f)
            return Synthetic("training", f, expected, expected * factor, declared(expected, rng))
    raise ValueError(f"no training job of {gpus} GPUs runs as short as {actual_s:.0f} s")


# Quantization: the hidden true model (seconds on the reference GPU for N billions).
QUANT_TRUTH = {"bitsandbytes": (4.0, 1.0, 0.0), "awq": (100.0, 0.95, 0.8), "gptq": (250.0, 0.77, 0.6)}
QUANT_MIX = {"gptq": 40, "awq": 40, "bitsandbytes": 20}


def true_quant_seconds(f: QuantFeatures) -> float:
    scale, exponent, calib_exp = QUANT_TRUTH[f.algorithm]
    billions = f.params / 1e9
    speed = prior.gpu_speed(f.gpu_type) ** (0.5 / 0.7)
    work = scale * billions**exponent * (f.calib_samples / 128) ** calib_exp / speed
    return 200.0 + 2.0 * billions / 1.0 + work


def quant_job(rng: random.Random, actual_s: float | None = None, gpus: int | None = None) -> Synthetic:
    """A random quantization job; given `actual_s`, one that actually ran that long.

    Like `training_job`, the noise is drawn first and the features are those whose
    noise-free time is nearest `actual_s / noise`: choosing the features nearest the
    actual duration itself would hand the forecaster a job without noise (the leak the
    planning comparison once had).
    """
    factor = noise(rng, NOISE_SIGMA["quantization"])
    target_s = None if actual_s is None else actual_s / factor
    best: tuple[float, QuantFeatures] | None = None
    for _ in range(1 if target_s is None else 60):
        gpu_type = _pick(rng, GPU_MIX)
        params = rng.choice(SIZES_B) * 1e9
        need = prior.quant_gpus(params, gpu_type)
        if gpus is not None and need > gpus:
            continue
        f = QuantFeatures(algorithm=_pick(rng, QUANT_MIX), params=params, bits=rng.choice([4, 4, 4, 8]),
                          gpu_type=gpu_type, calib_samples=rng.choices([64, 128, 256, 512], [10, 70, 15, 5])[0],
                          gpus=gpus or need)
        miss = 0.0 if target_s is None else abs(math.log(true_quant_seconds(f) / target_s))
        if best is None or miss < best[0]:
            best = (miss, f)
    if best is None:
        return quant_job(rng, actual_s, None)
    f = best[1]
    expected = true_quant_seconds(f)
    return Synthetic("quantization", f, expected, actual_s if actual_s is not None else expected * factor,
                     declared(expected, rng))
