"""Fused trials train exactly like separately trained ones; a pruned trial leaves the batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rota.jobkit.tuning.fused import FusedTrials, TrialHparams, fusion_count, profile_footprint
from rota.jobkit.tuning.lm import TinyLM, stdlib_batches
from rota.jobkit.tuning.scaling import ScaledModel, scale_width

pytestmark = pytest.mark.usefixtures("torch_one_thread")  # tests/conftest.py


HPARAMS = [TrialHparams(lr=3e-3), TrialHparams(lr=2e-2, beta1=0.8, weight_decay=0.1, output_mult=2.0),
           TrialHparams(lr=1e-3, beta2=0.99, output_mult=0.5)]


def _base() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(width=32, layers=1, heads=2, context=16)


def _surrogates(count: int) -> list[ScaledModel]:
    base = _base()
    return [scale_width(base, 2, seed=100 + i) for i in range(count)]


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = stdlib_batches(seed=0, batch=4, context=16, max_bytes=100_000)
    return [data.next() for _ in range(n)]


def _separately(model: ScaledModel, hp: TrialHparams, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """The same trial trained alone with torch.optim.AdamW and the muP parameter groups."""
    model.set_output_mult(hp.output_mult)
    opt = torch.optim.AdamW(model.param_groups(hp.lr, "adamw", hp.weight_decay), betas=(hp.beta1, hp.beta2), eps=hp.eps)
    losses = []
    for x, y in batches:
        loss = nn.functional.cross_entropy(model.module(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_fused_losses_equal_separately_trained_losses() -> None:
    batches = _batches(6)
    fused = FusedTrials(_surrogates(3), HPARAMS)
    fused_losses = [fused.step(b) for b in batches]
    for i, hp in enumerate(HPARAMS):
        alone = _separately(_surrogates(3)[i], hp, batches)
        assert [step[i] for step in fused_losses] == pytest.approx(alone, rel=1e-4, abs=1e-5)
    # The trials did learn, and differently: the check above is not comparing constants.
    assert fused_losses[-1][0] < fused_losses[0][0]
    assert len({round(v, 4) for v in fused_losses[-1]}) == 3


def test_a_pruned_trial_leaves_the_batch_and_the_others_carry_on_unchanged() -> None:
    batches = _batches(6)
    fused = FusedTrials(_surrogates(3), HPARAMS, trial_ids=[10, 11, 12])
    for b in batches[:3]:
        fused.step(b)
    fused.drop([11])
    assert fused.ids == [10, 12] and fused.size == 2
    assert all(p.shape[0] == 2 for p in fused.params.values())
    after = [fused.step(b) for b in batches[3:]]
    for column, i in ((0, 0), (1, 2)):
        alone = _separately(_surrogates(3)[i], HPARAMS[i], batches)
        assert [step[column] for step in after] == pytest.approx(alone[3:], rel=1e-4, abs=1e-5)
    fused.drop([10, 12])
    assert fused.step(batches[0]) == []


def test_a_paused_batch_resumes_from_its_state() -> None:
    batches = _batches(5)
    straight = FusedTrials(_surrogates(3), HPARAMS)
    expected = [straight.step(b) for b in batches]
    first = FusedTrials(_surrogates(3), HPARAMS)
    for b in batches[:2]:
        first.step(b)
    saved = first.state_dict()
    del first
    resumed = FusedTrials(_surrogates(3), HPARAMS)  # fresh weights, replaced by the saved ones
    resumed.load_state_dict(saved)
    for b, want in zip(batches[2:], expected[2:], strict=True):
        assert resumed.step(b) == pytest.approx(want, rel=1e-5)


def test_the_fusion_count_follows_the_profiled_footprints() -> None:
    batch = _batches(1)[0]

    def make(count: int) -> FusedTrials:
        return FusedTrials(_surrogates(count), [TrialHparams(lr=1e-3)] * count)

    m1, m2 = profile_footprint(make, batch, 1), profile_footprint(make, batch, 2)
    params = sum(p.numel() * 4 for p in _surrogates(1)[0].module.parameters())
    assert m1 > 4 * params  # weights, gradients, two AdamW moments, and the activations
    assert m2 - m1 == pytest.approx(m1, rel=0.25)  # a second trial costs about one more trial
    assert fusion_count(m1, m2, free=m1 + 5 * (m2 - m1)) == 5
    assert fusion_count(m1, m2, free=m1 + 5 * (m2 - m1), cap=3) == 3
    assert fusion_count(m1, m2, free=m1 - 1) == 0
    with pytest.raises(ValueError, match="m2"):
        fusion_count(10, 10, free=100)


def test_models_of_different_shapes_cannot_fuse() -> None:
    base = _base()
    with pytest.raises(ValueError, match="architecture"):
        FusedTrials([scale_width(base, 2), scale_width(base, 4)], HPARAMS[:2])
