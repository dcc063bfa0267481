"""Job features: 22 of them, defaults, and errors that name `features.<field>`."""

from __future__ import annotations

from typing import Any

import pytest

from rota.core.errors import InvalidArgument
from rota.core.forecasting.features import (
    TRAINING_FEATURES,
    VARIANTS,
    parse_quantization,
    parse_training,
    quant_mapping,
    to_mapping,
)

BASE: dict[str, Any] = {"variant": "lora-sft", "params": 1.3e9, "tokens": 2e8}


def test_there_are_22_training_features_and_10_variants() -> None:
    assert len(TRAINING_FEATURES) == 22
    assert len(VARIANTS) == 10
    assert {v.split("-")[0] for v in VARIANTS} == {"full", "lora"}
    assert {v.split("-")[1] for v in VARIANTS} == {"sft", "dpo", "rlhf", "rlvr", "cpt"}


def test_a_job_file_with_three_features_gets_the_documented_defaults() -> None:
    f = parse_training(BASE, gpus=2)
    assert (f.method, f.objective, f.params, f.tokens, f.gpus) == ("lora", "sft", 1.3e9, 2e8, 2)
    assert (f.seq_len, f.batch_size, f.micro_batch, f.gpu_type, f.precision) == (2048, 8, 4, "a100-80gb", "bf16")
    assert (f.rollout_fraction, f.reward_params, f.epochs) == (0.0, 0.0, 1.0)


def test_rl_variants_default_to_half_generated_tokens_and_rlhf_to_a_reward_model_as_large_as_the_policy() -> None:
    rlhf = parse_training({**BASE, "variant": "full-rlhf"}, gpus=1)
    rlvr = parse_training({**BASE, "variant": "lora-rlvr"}, gpus=1)
    assert (rlhf.rollout_fraction, rlhf.reward_params) == (0.5, 1.3e9)
    assert (rlvr.rollout_fraction, rlvr.reward_params) == (0.5, 0.0)


def test_integers_given_as_struct_doubles_are_accepted() -> None:
    assert parse_training({**BASE, "seq_len": 4096.0, "batch_size": 16.0}, gpus=1).seq_len == 4096


@pytest.mark.parametrize(("features", "gpus", "field"), [
    ({"params": 1e9, "tokens": 1e8}, 1, "features.variant"),
    ({**BASE, "variant": "qlora-sft"}, 1, "features.variant"),
    ({**BASE, "params": "big"}, 1, "features.params"),
    ({**BASE, "params": -1}, 1, "features.params"),
    ({**BASE, "tokens": None}, 1, "features.tokens"),
    ({**BASE, "seq_len": 100.5}, 1, "features.seq_len"),
    ({**BASE, "gpu_type": "tpu"}, 1, "features.gpu_type"),
    ({**BASE, "precision": "fp8", "gpu_type": "a100-80gb"}, 1, "features.precision"),
    ({**BASE, "tensor_parallel": 3}, 4, "features.tensor_parallel"),
    ({**BASE, "tensor_parallel": 4}, 2, "features.tensor_parallel"),
    ({**BASE, "variant": "full-sft", "quant_bits": 4}, 1, "features.quant_bits"),
    ({**BASE, "packing": "yes"}, 1, "features.packing"),
    ({**BASE, "parmas": 1e9}, 1, "features.parmas"),
    ({**BASE, "gpus": 2}, 2, "features.gpus"),
])
def test_a_bad_training_feature_is_named_in_the_error(features: dict[str, Any], gpus: int, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_training(features, gpus)
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")


@pytest.mark.parametrize(("features", "field"), [
    ({"params": 7e9}, "features.algorithm"),
    ({"algorithm": "hqq", "params": 7e9}, "features.algorithm"),
    ({"algorithm": "gptq", "params": 7e9, "bits": 5}, "features.bits"),
    ({"algorithm": "awq"}, "features.params"),
])
def test_a_bad_quantization_feature_is_named_in_the_error(features: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_quantization(features, 1)
    assert err.value.field == field


def test_features_round_trip_through_their_mapping() -> None:
    f = parse_training({**BASE, "variant": "full-dpo", "grad_checkpointing": True, "checkpoint_interval": 100}, 4)
    assert parse_training(to_mapping(f), 4) == f
    q = parse_quantization({"algorithm": "AWQ", "params": 7e9}, 1)
    assert q.algorithm == "awq"
    assert parse_quantization(quant_mapping(q), 1) == q
