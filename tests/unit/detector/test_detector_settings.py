"""The detector's decision rule is chosen by the operator's environment, and a wrong value
stops the settings with the variable's name."""

from __future__ import annotations

import pytest

from rota.common.config import Settings
from rota.core.detection.failslow import CUSUM, STREAK


@pytest.mark.parametrize(("env", "mode", "common_mode"), [
    ({}, CUSUM, True),
    ({"ROTA_DETECTOR_MODE": "streak"}, STREAK, True),
    ({"ROTA_DETECTOR_MODE": "streak", "ROTA_DETECTOR_COMMON_MODE": "0"}, STREAK, False),
    ({"ROTA_DETECTOR_COMMON_MODE": "0"}, CUSUM, False),
])
def test_the_cluster_runs_the_sequential_test_unless_the_environment_says_otherwise(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], mode: str, common_mode: bool) -> None:
    for name in ("ROTA_DETECTOR_MODE", "ROTA_DETECTOR_COMMON_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    detector = Settings.from_env().detector
    assert (detector.mode, detector.common_mode) == (mode, common_mode)


@pytest.mark.parametrize(("name", "value"), [
    ("ROTA_DETECTOR_MODE", "bayes"),
    ("ROTA_DETECTOR_COMMON_MODE", "yes please"),
])
def test_a_bad_value_names_its_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        Settings.from_env()


def test_settings_built_in_code_run_the_same_rule_as_the_environments_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROTA_DETECTOR_MODE", "ROTA_DETECTOR_COMMON_MODE"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().detector == Settings.from_env().detector
