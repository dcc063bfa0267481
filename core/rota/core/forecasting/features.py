"""The forecaster's job features (docs/design.md §5), parsed from a job's `features` mapping (pure).

Training jobs (and HPO trials) have the 22 features of `TRAINING_FEATURES`; `variant`,
`params` and `tokens` are required and the rest have the defaults shown. Quantization
jobs have `QUANT_FEATURES`. Every error is an `InvalidArgument` naming `features.<name>`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rota.core.errors import InvalidArgument

METHODS = ("full", "lora")
OBJECTIVES = ("sft", "dpo", "rlhf", "rlvr", "cpt")
VARIANTS = tuple(f"{m}-{o}" for m in METHODS for o in OBJECTIVES)
GPU_TYPES = ("v100", "a10g", "l40s", "a100-40gb", "a100-80gb", "h100", "h200", "cpu")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
ALGORITHMS = ("bitsandbytes", "awq", "gptq")
MAX_PARAMS = 2e12
MAX_TOKENS = 1e14

# name -> default (None: required). `gpus` is the job's own `gpus` field, not a feature key.
TRAINING_FEATURES: dict[str, Any] = {
    "variant": None, "params": None, "tokens": None, "epochs": 1.0, "seq_len": 2048,
    "batch_size": 8, "micro_batch": 0, "gpus": 1, "gpu_type": "a100-80gb", "precision": "bf16",
    "lora_rank": 16, "quant_bits": 16, "grad_checkpointing": False, "zero_stage": 0,
    "tensor_parallel": 1, "pipeline_parallel": 1, "flash_attention": True, "packing": True,
    "rollout_fraction": -1.0, "reward_params": -1.0, "eval_fraction": 0.0, "checkpoint_interval": 0,
}
QUANT_FEATURES: dict[str, Any] = {
    "algorithm": None, "params": None, "bits": 4, "gpu_type": "a100-80gb", "calib_samples": 128,
}


@dataclass(frozen=True)
class TrainingFeatures:
    method: str  # full | lora
    objective: str  # sft | dpo | rlhf | rlvr | cpt
    params: float
    tokens: float  # trained tokens per epoch
    epochs: float
    seq_len: int
    batch_size: int  # global batch, sequences per optimizer step
    micro_batch: int  # sequences per GPU per forward pass
    gpus: int
    gpu_type: str
    precision: str
    lora_rank: int
    quant_bits: int  # 16, or 4/8 for QLoRA-style quantized base weights
    grad_checkpointing: bool
    zero_stage: int
    tensor_parallel: int
    pipeline_parallel: int
    flash_attention: bool
    packing: bool
    rollout_fraction: float  # share of trained tokens the policy generated (RL variants)
    reward_params: float  # a separate reward model's parameters (RLHF)
    eval_fraction: float  # evaluation tokens per trained token (forward only)
    checkpoint_interval: int  # optimizer steps between checkpoints; 0 = only at the end

    @property
    def variant(self) -> str:
        return f"{self.method}-{self.objective}"

    @property
    def total_tokens(self) -> float:
        return self.tokens * self.epochs

    @property
    def steps(self) -> float:
        return max(1.0, self.total_tokens / (self.batch_size * self.seq_len))


@dataclass(frozen=True)
class QuantFeatures:
    algorithm: str
    params: float
    bits: int
    gpu_type: str
    calib_samples: int
    gpus: int


def _bad(name: str, reason: str) -> InvalidArgument:
    return InvalidArgument(f"features.{name}", reason)


def _number(raw: Mapping[str, Any], name: str, default: Any, low: float, high: float) -> float:
    value = raw.get(name, default)
    if value is None:
        raise _bad(name, "is required")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(name, f"must be a number (got {value!r})")
    try:
        number = float(value)
    except ValueError:
        raise _bad(name, f"must be a number (got {value!r})") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise _bad(name, f"must be between {low:g} and {high:g} (got {value!r})")
    return number


def _integer(raw: Mapping[str, Any], name: str, default: Any, low: int, high: int) -> int:
    number = _number(raw, name, default, low, high)
    if not number.is_integer():
        raise _bad(name, f"must be a whole number (got {raw.get(name)!r})")
    return int(number)


def _choice(raw: Mapping[str, Any], name: str, default: Any, choices: tuple[str, ...]) -> str:
    value = raw.get(name, default)
    if value is None:
        raise _bad(name, f"is required; one of {', '.join(choices)}")
    text = str(value).lower()
    if text not in choices:
        raise _bad(name, f"unknown {name} {value!r}; one of {', '.join(choices)}")
    return text


def _flag(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise _bad(name, f"must be true or false (got {value!r})")
    return value


def _known(raw: Mapping[str, Any], names: Mapping[str, Any]) -> None:
    for key in raw:
        if key == "gpus":
            raise _bad("gpus", "set the job's own gpus field instead")
        if key not in names:
            raise _bad(str(key), f"unknown feature (known: {', '.join(n for n in names if n != 'gpus')})")


def _power_of_two(name: str, n: int) -> int:
    if n & (n - 1):
        raise _bad(name, f"must be a power of two (got {n})")
    return n


def parse_training(raw: Mapping[str, Any], gpus: int) -> TrainingFeatures:
    """Validated features of a training job (or trial) that holds `gpus` GPUs."""
    d = TRAINING_FEATURES
    _known(raw, d)
    variant = _choice(raw, "variant", d["variant"], VARIANTS)
    method, objective = variant.split("-")
    batch = _integer(raw, "batch_size", d["batch_size"], 1, 1 << 20)
    micro = _integer(raw, "micro_batch", d["micro_batch"], 0, 1 << 16) or max(1, batch // max(gpus, 1))
    tp = _power_of_two("tensor_parallel", _integer(raw, "tensor_parallel", 1, 1, 64))
    pp = _integer(raw, "pipeline_parallel", 1, 1, 128)
    if gpus % (tp * pp):
        raise _bad("tensor_parallel", f"tensor x pipeline parallel ({tp} x {pp}) must divide the job's {gpus} GPUs")
    gpu_type = _choice(raw, "gpu_type", d["gpu_type"], GPU_TYPES)
    precision = _choice(raw, "precision", d["precision"], PRECISIONS)
    if precision == "fp8" and gpu_type not in ("h100", "h200", "l40s"):
        raise _bad("precision", f"fp8 needs an h100, h200 or l40s (gpu_type is {gpu_type})")
    rl = objective in ("rlhf", "rlvr")
    params = _number(raw, "params", d["params"], 1e3, MAX_PARAMS)
    rollout = _number(raw, "rollout_fraction", d["rollout_fraction"], -1, 1)
    reward = _number(raw, "reward_params", d["reward_params"], -1, MAX_PARAMS)
    quant_bits = _integer(raw, "quant_bits", d["quant_bits"], 4, 16)
    if quant_bits not in (4, 8, 16):
        raise _bad("quant_bits", f"one of 4, 8, 16 (got {quant_bits})")
    if quant_bits != 16 and method == "full":
        raise _bad("quant_bits", "quantized base weights need a LoRA variant")
    return TrainingFeatures(
        method=method, objective=objective, params=params,
        tokens=_number(raw, "tokens", d["tokens"], 1, MAX_TOKENS),
        epochs=_number(raw, "epochs", d["epochs"], 0.01, 1000),
        seq_len=_integer(raw, "seq_len", d["seq_len"], 16, 1 << 21),
        batch_size=batch, micro_batch=micro, gpus=gpus, gpu_type=gpu_type, precision=precision,
        lora_rank=_integer(raw, "lora_rank", d["lora_rank"], 1, 4096), quant_bits=quant_bits,
        grad_checkpointing=_flag(raw, "grad_checkpointing", d["grad_checkpointing"]),
        zero_stage=_integer(raw, "zero_stage", d["zero_stage"], 0, 3), tensor_parallel=tp, pipeline_parallel=pp,
        flash_attention=_flag(raw, "flash_attention", d["flash_attention"]),
        packing=_flag(raw, "packing", d["packing"]),
        rollout_fraction=(0.5 if rl else 0.0) if rollout < 0 else rollout,
        reward_params=(params if objective == "rlhf" else 0.0) if reward < 0 else reward,
        eval_fraction=_number(raw, "eval_fraction", d["eval_fraction"], 0, 10),
        checkpoint_interval=_integer(raw, "checkpoint_interval", d["checkpoint_interval"], 0, 1 << 30),
    )


def parse_quantization(raw: Mapping[str, Any], gpus: int) -> QuantFeatures:
    d = QUANT_FEATURES
    _known(raw, d)
    bits = _integer(raw, "bits", d["bits"], 2, 8)
    if bits not in (2, 3, 4, 8):
        raise _bad("bits", f"one of 2, 3, 4, 8 (got {bits})")
    return QuantFeatures(
        algorithm=_choice(raw, "algorithm", d["algorithm"], ALGORITHMS),
        params=_number(raw, "params", d["params"], 1e3, MAX_PARAMS), bits=bits,
        gpu_type=_choice(raw, "gpu_type", d["gpu_type"], GPU_TYPES),
        calib_samples=_integer(raw, "calib_samples", d["calib_samples"], 1, 1 << 20), gpus=gpus,
    )


def to_mapping(f: TrainingFeatures) -> dict[str, Any]:
    """The features as a job file would give them (round-trips through `parse_training`)."""
    out: dict[str, Any] = {"variant": f.variant}
    for name in TRAINING_FEATURES:
        if name not in ("variant", "gpus"):
            out[name] = getattr(f, name)
    return out


def quant_mapping(f: QuantFeatures) -> dict[str, Any]:
    return {name: getattr(f, name) for name in QUANT_FEATURES}
