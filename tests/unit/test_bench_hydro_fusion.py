"""``rota bench hydro``'s fusion section: every arm's trials/s counts the step loops only."""

from __future__ import annotations

import pytest


def test_trials_per_s_counts_step_loops_and_reports_setup_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from rota.bench import hydro_fidelity
    from rota.bench.hydro_fidelity import Setup, TrainTiming

    # Stand-in trainings with a known split (no torch work): each run of the step loop takes
    # 0.1 s per trial, its setup (model build, data, evaluation) 1 s whatever the batch.
    def batch(setup: Setup, factor: int, count: int, steps: int) -> TrainTiming:
        return TrainTiming(step_s=0.1 * count, setup_s=1.0)

    monkeypatch.setattr(hydro_fidelity, "_trial_batch", batch)
    monkeypatch.setattr(hydro_fidelity, "_processes_round",
                        lambda setup, factor, steps: (TrainTiming(step_s=0.2, setup_s=2.0), 3.0))
    result = hydro_fidelity.fusion(Setup(), steps=1, repeats=2)
    rates = result["trials_per_s"]
    assert isinstance(rates, dict)
    # One at a time: 4 trials in 0.4 s of step loops, not 4 in 4.4 s with their 4 setups.
    assert rates["sequential"] == pytest.approx(10.0)
    assert rates["fused_8"] == pytest.approx(10.0)
    assert rates["processes"] == pytest.approx(20.0)
    assert result["fused_8_vs_sequential"] == pytest.approx(1.0)
    assert result["setup_s"] == {"sequential": pytest.approx(4.0), "processes": pytest.approx(2.0),
                                 "fused_4": pytest.approx(1.0), "fused_8": pytest.approx(1.0),
                                 "fused_16": pytest.approx(1.0)}
    assert set(result["wall_trials_per_s"]) == set(rates)  # type: ignore[arg-type]
