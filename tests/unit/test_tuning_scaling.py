"""The width pass: widths shrink by S, the input's fan-in and the output's fan-out stay, muP rules apply."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rota.jobkit.tuning.lm import TinyLM
from rota.jobkit.tuning.scaling import READOUT_MULT, scale_width


def _model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(width=64, layers=2, heads=2, context=16)


@pytest.mark.parametrize("factor", [1, 4, 8])
def test_widths_shrink_and_the_ends_keep_their_sizes(factor: int) -> None:
    scaled = scale_width(_model(), factor, seed=0).module
    width = 64 // factor
    assert scaled.get_submodule("tok").num_embeddings == 256  # input fan-in (vocabulary) kept
    assert scaled.get_submodule("tok").embedding_dim == width
    assert scaled.get_submodule("pos").embedding_dim == width
    qkv = scaled.get_submodule("blocks.0.attn.qkv")
    assert (qkv.in_features, qkv.out_features) == (width, 3 * width)  # attention width
    ff = scaled.get_submodule("blocks.1.ff_in")
    assert (ff.in_features, ff.out_features) == (width, 4 * width)  # feed-forward width
    assert scaled.get_submodule("blocks.0.ln1").normalized_shape == (width,)
    head = scaled.get_submodule("head")
    assert (head.in_features, head.out_features) == (width, 256)  # output fan-out kept


def test_the_original_model_is_untouched_and_the_surrogate_runs_forward() -> None:
    model = _model()
    scaled = scale_width(model, 4, seed=0)
    assert model.tok.embedding_dim == 64
    idx = torch.randint(0, 256, (3, 16))
    assert scaled.module(idx).shape == (3, 16, 256)
    assert sum(p.numel() for p in scaled.module.parameters()) < sum(p.numel() for p in model.parameters()) / 8


def test_the_readout_is_multiplied_by_output_mult_times_s() -> None:
    scaled = scale_width(_model(), 4, output_mult=0.5, seed=0)
    assert float(getattr(scaled.module, READOUT_MULT)) == pytest.approx(2.0)
    head = scaled.module.get_submodule("head")
    assert torch.count_nonzero(head.weight) == 0  # muP readout: zero init
    with torch.no_grad():
        head.weight.normal_()
    idx = torch.randint(0, 256, (2, 16))
    before = scaled.module(idx)
    scaled.set_output_mult(1.5)  # 1.5 * 4 = 6 = 3x the multiplier before
    assert torch.allclose(scaled.module(idx), 3 * before, atol=1e-5)


def test_learning_rates_scale_per_optimizer_for_matrix_and_vector_like_parameters() -> None:
    scaled = scale_width(_model(), 8, seed=0)
    adam = scaled.lr_multipliers("adam")
    sgd = scaled.lr_multipliers("sgd")
    assert scaled.kind("blocks.0.attn.qkv.weight") == "matrix"
    assert adam["blocks.0.attn.qkv.weight"] == 8 and adam["blocks.0.ff_out.weight"] == 8
    for vector in ("tok.weight", "head.weight", "blocks.0.ln1.weight", "blocks.0.ff_in.bias"):
        assert scaled.kind(vector) == "vector"
        assert adam[vector] == 1
        assert sgd[vector] == pytest.approx(1 / 8)
    assert sgd["blocks.0.attn.qkv.weight"] == 1
    groups = scaled.param_groups(0.01, "adamw", weight_decay=0.1)
    lrs = sorted(g["lr"] for g in groups)  # type: ignore[type-var]
    assert lrs == pytest.approx([0.01, 0.08])
    # Decoupled decay lr * wd stays width-free.
    assert all(g["lr"] * g["weight_decay"] == pytest.approx(0.001) for g in groups)  # type: ignore[operator]


def test_s1_keeps_the_architecture() -> None:
    model = _model()
    scaled = scale_width(model, 1, seed=0).module
    shapes = {n: p.shape for n, p in model.named_parameters()}
    assert {n: p.shape for n, p in scaled.named_parameters()} == shapes


def test_a_width_that_s_does_not_divide_is_refused_naming_the_layer() -> None:
    with pytest.raises(ValueError, match=r"tok\.embedding_dim: width 64 is not divisible by S=3"):
        scale_width(_model(), 3)
    with pytest.raises(ValueError, match="factor"):
        scale_width(_model(), 0)


def test_a_linear_fed_by_the_input_keeps_its_fan_in() -> None:
    mlp = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    scaled = scale_width(mlp, 4, seed=0)
    first, hidden, last = (scaled.module.get_submodule(n) for n in ("0", "2", "4"))
    assert (first.in_features, first.out_features) == (10, 8)
    assert (hidden.in_features, hidden.out_features) == (8, 8)
    assert (last.in_features, last.out_features) == (8, 3)
    assert scaled.kind("0.weight") == "vector" and scaled.kind("2.weight") == "matrix"
    assert scaled.module(torch.randn(5, 10)).shape == (5, 3)
