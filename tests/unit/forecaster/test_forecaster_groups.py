"""The VC join of the two Philly files, and expected durations pooled by a caller's key."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from rota.bench.forecast_groups import MIN_MATCHES, loo_means, vc_labels
from rota.core.forecasting.history import Past
from rota.core.forecasting.survival import expected_durations


def _write(dir_: Path, jobs: list[tuple[str, int, int]], arrivals: list[tuple[str, float, int]]) -> None:
    with open(dir_ / "philly_multigpu_pass.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_s", "num_gpus"])
        w.writerows(jobs)
    with open(dir_ / "philly_vc_arrivals_gavel.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["vc", "seq", "arrival_s", "num_gpus"])
        w.writerows((vc, i, a, g) for i, (vc, a, g) in enumerate(arrivals))


def test_vc_labels_aligns_each_vc_by_its_own_shift(tmp_path: Path) -> None:
    n = MIN_MATCHES + 5
    jobs = [(f"a{i}", 1_000 + 997 * i, 4) for i in range(n)] + [(f"b{i}", 50_000 + 613 * i, 8) for i in range(n)]
    # VC "va" starts its clock at submit 1,000, "vb" at 50,000; each also has 1-GPU jobs the join ignores
    arrivals = [("va", 997.0 * i, 4) for i in range(n)] + [("va", 5.0, 1)]
    arrivals += [("vb", 613.0 * i, 8) for i in range(n)] + [("vc", 17.0 * i, 2) for i in range(3)]
    _write(tmp_path, jobs, arrivals)
    labels = vc_labels(tmp_path)
    assert all(labels[f"a{i}"] == "va" for i in range(n))
    assert all(labels[f"b{i}"] == "vb" for i in range(n))
    assert "vc" not in labels.values()  # too few coincidences to place that VC


def test_vc_labels_leaves_a_job_two_vcs_claim_unlabelled(tmp_path: Path) -> None:
    n = MIN_MATCHES + 5
    jobs = [(f"a{i}", 1_000 + 997 * i, 4) for i in range(n)]
    arrivals = [("va", 997.0 * i, 4) for i in range(n)] + [("vb", 997.0 * i, 4) for i in range(n)]
    _write(tmp_path, jobs, arrivals)
    assert vc_labels(tmp_path) == {}


def _job(submit: float, seconds: float, declared: float = 3600.0) -> Past:
    return Past(submit, submit + seconds, seconds, 8, 12.0, declared)


def test_expected_durations_pools_by_the_callers_key() -> None:
    # Same limit throughout; the key separates a short group from a long one.
    jobs = [_job(float(i), 10.0) for i in range(5)] + [_job(100.0 + i, 1000.0) for i in range(5)]
    jobs += [_job(5000.0, 10.0), _job(5001.0, 1000.0), _job(5002.0, 500.0)]
    keys = ["short"] * 5 + ["long"] * 5 + ["short", "long", None]
    out = expected_durations(jobs, [7.0] * len(jobs), min_same=5, keys=keys)
    assert out[10] == pytest.approx(10.0)
    assert out[11] == pytest.approx(1000.0)
    assert out[12] == 7.0  # no key: its fallback
    by_limit = expected_durations(jobs, [7.0] * len(jobs), min_same=5)
    assert by_limit[10] == pytest.approx(505.0)  # pooled over both groups, as before


def test_expected_durations_refuses_keys_of_another_length() -> None:
    with pytest.raises(ValueError, match="keys"):
        expected_durations([_job(0.0, 1.0)], [1.0], keys=[])


def test_loo_means_leave_the_item_out() -> None:
    out = loo_means(["x", "x", "x", "y"], np.array([1.0, 2.0, 6.0, 5.0]), np.full(4, -1.0))
    assert out.tolist() == [4.0, 3.5, 1.5, -1.0]
