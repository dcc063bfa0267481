"""The physical prior: what a job should take from first principles (docs/design.md §5; pure).

Training FLOPs per trained token are 2N forward and 4N backward for full training (6N,
Kaplan et al. 2020), plus 6·L·s·d for attention. LoRA freezes the base weights: the
backward pass still propagates activation gradients (2N) but computes no weight
gradients, so it costs about 4N, plus the adapters' own 6·n_adapter. Gradient
checkpointing adds one more forward. DPO adds a frozen reference forward (2N); RLHF
(PPO) adds a critic as large as the policy, a reference and a reward-model forward;
RL variants also generate `rollout_fraction` of their tokens at decode speed. Seconds
are FLOPs over the GPUs' dense peak for the precision times a model FLOPs utilisation
(MFU), plus startup (weights loaded from storage) and checkpoint writes.

The constants are nominal published figures, deliberately simple: the learned model in
`training.py` corrects whatever they get wrong on this cluster's completed jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rota.core.forecasting.features import QuantFeatures, TrainingFeatures


@dataclass(frozen=True)
class GpuType:
    memory_gb: float
    peak_tflops: dict[str, float]  # dense tensor-core peak per precision (fp32 = TF32 where there is one)


GPU_TYPES: dict[str, GpuType] = {
    "v100": GpuType(32, {"fp32": 15.7, "fp16": 125, "bf16": 15.7}),  # no bf16 tensor cores
    "a10g": GpuType(24, {"fp32": 35, "fp16": 70, "bf16": 70}),
    "l40s": GpuType(48, {"fp32": 183, "fp16": 362, "bf16": 362, "fp8": 733}),
    "a100-40gb": GpuType(40, {"fp32": 156, "fp16": 312, "bf16": 312}),
    "a100-80gb": GpuType(80, {"fp32": 156, "fp16": 312, "bf16": 312}),
    "h100": GpuType(80, {"fp32": 495, "fp16": 989, "bf16": 989, "fp8": 1979}),
    "h200": GpuType(141, {"fp32": 495, "fp16": 989, "bf16": 989, "fp8": 1979}),
    "cpu": GpuType(16, {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0}),  # a virtual slot of `rota up`
}
REFERENCE_GPU = "a100-80gb"


@dataclass(frozen=True)
class TrainingConstants:
    mfu_full: float = 0.40
    mfu_lora: float = 0.30
    quantized_base: float = 0.6  # QLoRA dequantizes weights on every pass
    decode_mfu: float = 0.05  # autoregressive generation is memory-bound
    scale_in_node: float = 0.95  # efficiency kept per doubling of GPUs up to a node (8)
    scale_across: float = 0.85  # per doubling across nodes
    tp_cost: float = 0.92  # per doubling of tensor parallelism
    no_flash: float = 0.85
    padding: float = 0.75  # share of useful tokens without sequence packing
    zero3: float = 0.92
    ppo_overhead: float = 1.0
    startup_s: float = 120.0
    load_gbps: float = 2.0  # weights from storage
    save_gbps: float = 1.0
    lora_targets: int = 4  # adapted matrices per layer (q, k, v, o)


NOMINAL = TrainingConstants()


def shape(params: float) -> tuple[int, int]:
    """(layers, hidden) of a dense transformer of `params` (N ≈ 12·L·d², d ≈ 128·L)."""
    hidden = (params * 128 / 12) ** (1 / 3)
    return max(1, round(hidden / 128)), int(hidden)


def peak_flops(gpu_type: str, precision: str) -> float:
    peaks = GPU_TYPES[gpu_type].peak_tflops
    return peaks.get(precision, peaks["fp32"]) * 1e12


def training_flops(f: TrainingFeatures, c: TrainingConstants = NOMINAL) -> tuple[float, float]:
    """(compute-bound FLOPs, generation FLOPs) of the whole job."""
    n, tokens = f.params, f.total_tokens / (1.0 if f.packing else c.padding)
    layers, hidden = shape(n)
    attention = 6.0 * layers * f.seq_len * hidden
    forward = 2.0 * n
    if f.method == "full":
        per_token = 6.0 * n + attention
    else:
        adapters = 2.0 * f.lora_rank * hidden * layers * c.lora_targets
        per_token = 4.0 * n + 6.0 * adapters + attention
    if f.grad_checkpointing:
        per_token += forward
    if f.objective == "dpo":
        per_token += forward  # frozen reference model
    elif f.objective == "rlhf":
        per_token = (2 * per_token + forward + 2.0 * f.reward_params) * c.ppo_overhead  # + critic, ref, reward
    elif f.objective == "rlvr":
        per_token += forward
    compute = per_token * tokens + forward * f.eval_fraction * tokens
    generation = forward * f.rollout_fraction * tokens
    return compute, generation


def mfu(f: TrainingFeatures, c: TrainingConstants = NOMINAL) -> float:
    u = c.mfu_full if f.method == "full" else c.mfu_lora
    if f.quant_bits < 16:
        u *= c.quantized_base
    doublings = math.log2(max(f.gpus, 1))
    u *= c.scale_in_node ** min(doublings, 3) * c.scale_across ** max(0.0, doublings - 3)
    u *= c.tp_cost ** math.log2(f.tensor_parallel)
    if f.pipeline_parallel > 1:
        micro_batches = max(1.0, f.batch_size / (f.micro_batch * max(1, f.gpus // (f.tensor_parallel * f.pipeline_parallel))))
        u *= micro_batches / (micro_batches + f.pipeline_parallel - 1)
    if not f.flash_attention:
        u *= c.no_flash
    if f.zero_stage == 3:
        u *= c.zero3
    return u


def overhead_seconds(f: TrainingFeatures, c: TrainingConstants = NOMINAL) -> float:
    weights = 2.0 * f.params / 1e9  # GB in 16-bit
    state = weights * (8.0 if f.method == "full" else 0.02)  # + Adam moments and master weights
    checkpoints = math.floor(f.steps / f.checkpoint_interval) if f.checkpoint_interval else 1
    return c.startup_s + weights / c.load_gbps + checkpoints * (weights + state) / c.save_gbps / max(1, f.gpus)


def training_seconds(f: TrainingFeatures, c: TrainingConstants = NOMINAL) -> float:
    """The prior's wall-clock duration of a training job on its GPUs."""
    compute, generation = training_flops(f, c)
    peak = peak_flops(f.gpu_type, f.precision) * f.gpus
    u = mfu(f, c)
    return compute / (peak * u) + generation / (peak * c.decode_mfu) + overhead_seconds(f, c)


# Quantization: seconds a billion parameters on the reference GPU, nominal figures from
# the algorithms' papers and tools: bitsandbytes quantizes while loading; AWQ searches
# per-channel scales on ~128 calibration samples (~10 min for 7B); GPTQ solves a
# layer-wise least-squares problem (~4 GPU-hours for 175B on an A100).
QUANT_SECONDS_PER_B = {"bitsandbytes": 3.0, "awq": 90.0, "gptq": 110.0}
QUANT_STARTUP_S = 120.0


def gpu_speed(gpu_type: str) -> float:
    """Throughput relative to the reference GPU in 16-bit (quantization is partly memory-bound)."""
    return (peak_flops(gpu_type, "fp16") / peak_flops(REFERENCE_GPU, "fp16")) ** 0.7


def quant_gpus(params: float, gpu_type: str) -> int:
    """GPUs whose memory holds the 16-bit weights with 20% headroom (a power of two)."""
    need = 2.0 * params / 1e9 * 1.2 / GPU_TYPES[gpu_type].memory_gb
    return 1 if need <= 1 else 1 << math.ceil(math.log2(need))


def quantization_seconds(f: QuantFeatures) -> float:
    billions = f.params / 1e9
    load = 2.0 * billions / NOMINAL.load_gbps
    return QUANT_STARTUP_S + load + QUANT_SECONDS_PER_B[f.algorithm] * billions / gpu_speed(f.gpu_type)
