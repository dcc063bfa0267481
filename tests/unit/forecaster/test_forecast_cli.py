"""`rota forecast` / `rota traffic`: traffic files, durations for people, and the parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.cli.forecast_commands import human
from rota.cli.main import build_parser
from rota.client.errors import InvalidArgumentError
from rota.client.forecast import TrafficSample, load_traffic, traffic_requests


@pytest.mark.parametrize(("name", "text"), [
    ("t.csv", "hour,requests\n2026-05-01T00:00:00,120\n2026-05-01T01:00:00Z,80.5\n"),
    ("t.csv", "time,count\n1777593600,120\n1777597200,80.5\n"),
    ("t.json", '[{"hour": "2026-05-01T00:00:00", "requests": 120}, {"hour": 1777597200, "requests": 80.5}]'),
    ("t.json", '{"2026-05-01T00:00:00+00:00": 120, "2026-05-01T01:00:00": 80.5}'),
])
def test_traffic_files_read_as_unix_hours_and_counts(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    assert load_traffic(tmp_path / name) == [TrafficSample(1777593600, 120.0), TrafficSample(1777597200, 80.5)]


@pytest.mark.parametrize(("name", "text", "field"), [
    ("t.csv", "hour,requests\n2026-05-01T00:00:00,many\n", "row 1.requests"),
    ("t.csv", "hour,requests\n2026-05-01T00:00:00,-3\n", "row 1.requests"),
    ("t.csv", "hour,requests\nyesterday,3\n", "row 1.hour"),
    ("t.csv", "when,requests\n1,3\n", "row 1"),
    ("t.csv", "hour,requests\n", "file"),
    ("t.json", "[1, 2]", "file"),
    ("t.json", "{", "file"),
])
def test_a_bad_traffic_file_names_the_row_and_column(tmp_path: Path, name: str, text: str, field: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError) as err:
        load_traffic(tmp_path / name)
    assert err.value.field == field


def test_each_sample_is_an_observation_keyed_by_app_and_time() -> None:
    (r,) = traffic_requests("chat", [TrafficSample(7200, 5.0)])
    assert (r.key, r.app, r.at_unix, r.requests) == ("traffic:chat:7200", "chat", 7200, 5.0)


@pytest.mark.parametrize(("seconds", "text"), [(45, "45s"), (600, "10m"), (4320, "1h 12m"), (187200, "2d 4h")])
def test_durations_print_for_people(seconds: float, text: str) -> None:
    assert human(seconds) == text


def test_the_cli_has_forecast_and_traffic_commands() -> None:
    args = build_parser().parse_args(["forecast", "job.yaml", "--quantile", "0.9", "--json"])
    assert (args.command, args.file, args.quantile, args.json) == ("forecast", "job.yaml", 0.9, True)
    args = build_parser().parse_args(["traffic", "push", "chat", "t.csv"])
    assert (args.command, args.traffic_command, args.app, args.file) == ("traffic", "push", "chat", "t.csv")
