"""The planning bounds' pooling and the realtime frontier's comparison at equal GPU-hours, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rota.bench.forecast_bounds import group_means, local_loo_means
from rota.bench.forecast_realtime import _headroom, unmet_at


def test_group_means_pool_each_key() -> None:
    got = group_means(["a", "b", "a", "b", "c"], np.array([1.0, 10.0, 3.0, 30.0, 7.0]))
    assert got.tolist() == [2.0, 20.0, 2.0, 20.0, 7.0]


def test_local_means_leave_the_job_itself_out() -> None:
    hour = 3600.0
    submit = np.array([0.0, 1.0, 2.0, 100.0]) * hour
    limits = np.array([8.0, 8.0, 4.0, 8.0])
    run = np.array([10.0, 50.0, 5.0, 90.0])
    got = local_loo_means(submit, limits, run, hours=6.0)
    # job 0's only same-limit sibling within 6 h is job 1 (its own 10 is left out), and back;
    # job 2 has no sibling of its limit, job 3 none within 6 h: their limit's mean of all jobs
    assert got.tolist() == [50.0, 10.0, 5.0, 50.0]


def test_headroom_is_whole_gpus_rounded_down() -> None:
    seen = np.array([0.0, 4.0, 40.0])
    assert _headroom(seen, 0.1)(2) == 4.0  # 0.4 of a GPU: none added
    assert _headroom(seen, 0.1)(3) == 44.0


def test_unmet_at_interpolates_on_the_lower_envelope() -> None:
    points = [(100.0, 50.0), (200.0, 10.0), (150.0, 60.0)]  # the middle one is dominated: left out
    assert unmet_at(points, 150.0) == pytest.approx(30.0)
    assert unmet_at(points, 100.0) == 50.0
    assert unmet_at(points, 99.0) is None and unmet_at(points, 201.0) is None
    assert unmet_at([(100.0, 5.0)], 100.0) == 5.0
