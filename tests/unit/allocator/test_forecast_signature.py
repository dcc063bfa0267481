"""Jobs share a forecast exactly when the forecaster would see the same inputs."""

from __future__ import annotations

from typing import Any

import pytest

from rota.allocator.forecasts import _signature

BASE: dict[str, Any] = {"name": "a", "tenant": "t", "kind": "training", "gpus": 2, "features": {"model": "7b", "tokens": 1e9},
                        "duration_seconds": 600.0, "command": ["python", "train.py"]}


@pytest.mark.parametrize("change,shared", [
    ({"priority": 9, "duration_seconds": 600.0}, True),
    ({"name": "b"}, False),
    ({"command": ["python", "other.py"]}, False),
    ({"tenant": "u"}, False),
    ({"features": {"tokens": 1e9, "model": "7b"}}, True),
    ({"features": {"model": "13b", "tokens": 1e9}}, False),
    ({"gpus": 4}, False),
    ({"kind": "batch_inference"}, False),
    ({"duration_seconds": None}, False),
], ids=["priority does not matter", "the name does (own runs)", "the command does (own runs)",
        "the tenant does (own runs)", "feature order does not matter", "a feature value does",
        "the GPU count does", "the kind does", "a declared duration does"])
def test_jobs_share_a_forecast_when_the_forecaster_inputs_match(change: dict[str, Any], shared: bool) -> None:
    assert (_signature(BASE) == _signature({**BASE, **change})) is shared
