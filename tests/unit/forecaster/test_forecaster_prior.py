"""The physical prior, checked against FLOPs and seconds worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from rota.core.forecasting import prior
from rota.core.forecasting.features import parse_quantization, parse_training

# A 1e9-parameter model: d = (1e9 * 128 / 12)^(1/3) = 2201.4 -> 2201, L = round(2201.4 / 128) = 17.
N, T = 1e9, 1e9
ATTENTION = 6 * 17 * 2048 * 2201  # 6·L·s·d = 459,780,096 FLOPs per token
ADAPTERS = 2 * 16 * 2201 * 17 * 4  # rank 16, q/k/v/o: 4,789,376 parameters


def job(gpus: int = 1, **kw: Any) -> Any:
    return parse_training({"variant": "full-sft", "params": N, "tokens": T, **kw}, gpus)


def test_a_1b_model_has_17_layers_of_width_2201() -> None:
    assert prior.shape(1e9) == (17, 2201)


@pytest.mark.parametrize(("variant", "extra", "per_token", "generated"), [
    ("full-sft", {}, 6 * N + ATTENTION, 0.0),
    ("full-cpt", {}, 6 * N + ATTENTION, 0.0),
    ("lora-sft", {}, 4 * N + 6 * ADAPTERS + ATTENTION, 0.0),
    ("full-sft", {"grad_checkpointing": True}, 8 * N + ATTENTION, 0.0),
    ("full-dpo", {}, 8 * N + ATTENTION, 0.0),  # + a frozen reference forward
    ("full-rlvr", {}, 8 * N + ATTENTION, 2 * N * 0.5),  # + reference; half the tokens generated
    ("full-rlhf", {"reward_params": 1e8}, 2 * (6 * N + ATTENTION) + 2 * N + 2 * 1e8, 2 * N * 0.5),
    ("full-sft", {"eval_fraction": 0.1}, 6 * N + ATTENTION + 0.1 * 2 * N, 0.0),
])
def test_training_flops_per_token_follow_the_variant(variant: str, extra: dict[str, Any], per_token: float,
                                                    generated: float) -> None:
    compute, generation = prior.training_flops(job(variant=variant, **extra))
    assert compute == pytest.approx(per_token * T, rel=1e-9)
    assert generation == pytest.approx(generated * T, rel=1e-9)


def test_without_packing_padding_inflates_the_tokens_by_a_quarter() -> None:
    packed, _ = prior.training_flops(job())
    padded, _ = prior.training_flops(job(packing=False))
    assert padded == pytest.approx(packed / 0.75)


def test_full_training_of_1b_on_1b_tokens_on_one_a100_takes_14_4_hours() -> None:
    # compute: 6.459780096e18 FLOPs / (312e12 peak x 0.40 MFU) = 51,761.06 s;
    # overhead: 120 s start + 2 GB / 2 GB/s load + one final checkpoint of 2 + 16 GB at 1 GB/s = 139 s.
    assert prior.training_seconds(job()) == pytest.approx((6 * N + ATTENTION) * T / (312e12 * 0.40) + 139, rel=1e-9)


def test_lora_costs_two_thirds_of_full_training_flops_but_runs_at_a_lower_mfu() -> None:
    seconds = prior.training_seconds(job(variant="lora-sft"))
    # 4.488516352e18 / (312e12 x 0.30) + 120 + 1 + (2 + 0.04) = 47,954.23 + 123.04
    assert seconds == pytest.approx((4 * N + 6 * ADAPTERS + ATTENTION) * T / (312e12 * 0.30) + 123.04, rel=1e-9)


@pytest.mark.parametrize(("gpus", "mfu"), [
    (1, 0.40), (2, 0.40 * 0.95), (8, 0.40 * 0.95**3), (16, 0.40 * 0.95**3 * 0.85), (64, 0.40 * 0.95**3 * 0.85**3),
])
def test_mfu_loses_5_percent_per_doubling_in_a_node_and_15_across_nodes(gpus: int, mfu: float) -> None:
    assert prior.mfu(job(gpus=gpus)) == pytest.approx(mfu)


def test_pipeline_parallelism_pays_its_bubble() -> None:
    # 8 GPUs, pp 4 -> 2 data-parallel replicas; batch 64 / (micro 4 x 2) = 8 micro-batches; 8 / (8 + 3).
    f = job(gpus=8, pipeline_parallel=4, batch_size=64, micro_batch=4)
    assert prior.mfu(f) == pytest.approx(0.40 * 0.95**3 * 8 / 11)


def test_faster_gpus_and_lower_precision_shorten_the_prior() -> None:
    a100 = prior.training_seconds(job())
    h100 = prior.training_seconds(job(gpu_type="h100"))
    fp8 = prior.training_seconds(job(gpu_type="h100", precision="fp8"))
    assert a100 > h100 > fp8


def test_quantization_prior_is_startup_plus_loading_plus_seconds_per_billion() -> None:
    f = parse_quantization({"algorithm": "gptq", "params": 7e9}, 1)
    assert prior.quantization_seconds(f) == pytest.approx(120 + 14 / 2 + 110 * 7)


@pytest.mark.parametrize(("params", "gpu_type", "gpus"), [
    (7e9, "a100-80gb", 1), (70e9, "a100-80gb", 4), (70e9, "h200", 2), (405e9, "h100", 16),
])
def test_quantization_needs_the_gpus_that_hold_its_16_bit_weights(params: float, gpu_type: str, gpus: int) -> None:
    # 70B: 140 GB x 1.2 = 168 GB -> 2.1 A100-80GB -> 4; 1.19 H200 -> 2; 405B: 972 GB / 80 = 12.2 -> 16.
    assert prior.quant_gpus(params, gpu_type) == gpus
