"""The job side (rota.runtime.report_iteration) and the agent's link that forwards it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from rota.agent.detector_link import DetectorLink, beating_ranks, report_request
from rota.agent.processes import LocalJob, ProcessTable
from rota.common.config import Settings
from rota.detector.service import report_from_proto
from rota.runtime import heartbeat, report_iteration

MICRO = [[[2048, 1024], [4096]], [[512] * 4, [8000]]]


def test_a_report_is_one_json_line_that_reaches_the_detector_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "iterations.jsonl"
    monkeypatch.setenv("ROTA_ITERATIONS_FILE", str(path))
    report_iteration(7, rank_seconds=[0.5, None, 0.7, 0.8], micro_batches=MICRO, tp=1, pp=2, dp=2, iteration_seconds=1.5)
    heartbeat(1)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 2 and lines[1] == {"beat": [1]}
    assert beating_ranks(lines[0]) == {0, 2, 3} and beating_ranks(lines[1]) == {1}
    job = LocalJob("j-1", 4, [0, 1], 1, tmp_path)
    report = report_from_proto(report_request(job, lines[0]))
    assert (report.iteration, report.layout.as_dict(), report.iteration_seconds) == (7, {"tp": 1, "pp": 2, "dp": 2}, 1.5)
    assert report.rank_seconds == (0.5, None, 0.7, 0.8)
    assert report.micro_batches == ((((2048, 1024), (4096,))), ((512,) * 4, (8000,)))
    assert report.predicted_seconds == 0.0  # none sent


def test_a_predicted_step_time_reaches_the_detector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "iterations.jsonl"
    monkeypatch.setenv("ROTA_ITERATIONS_FILE", str(path))
    report_iteration(3, rank_seconds=[0.5] * 4, micro_batches=MICRO, tp=1, pp=2, dp=2, iteration_seconds=1.5,
                     predicted_seconds=1.25)  # e.g. an overlap plan's predicted_step_s
    line = json.loads(path.read_text())
    report = report_from_proto(report_request(LocalJob("j-1", 4, [0, 1], 1, tmp_path), line))
    assert report.predicted_seconds == 1.25


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"rank_seconds": [1.0] * 3}, "tp*pp*dp"),
    ({"rank_seconds": [1.0, float("inf"), 1.0, 1.0]}, "rank_seconds[1]"),
    ({"micro_batches": MICRO[:1]}, "dp = 2"),
    ({"micro_batches": [[[1]], [[1], [2]]]}, "same number"),
    ({"micro_batches": [[[0]], [[1]]]}, "micro_batches[0][0]"),
    ({"stage_of_rank": [0, 0, 0, 2]}, "stage_of_rank"),
    ({"tp": 0}, "tp must be"),
    ({"predicted_seconds": -1.0}, "predicted_seconds"),
])
def test_a_bad_report_raises_a_value_error_that_says_what(kwargs: dict[str, Any], words: str) -> None:
    args: dict[str, Any] = {"rank_seconds": [1.0] * 4, "micro_batches": MICRO, "tp": 1, "pp": 2, "dp": 2, **kwargs}
    with pytest.raises(ValueError, match=words.replace("*", r"\*").replace("[", r"\[")):
        report_iteration(1, **args)


def test_outside_rota_reports_only_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTA_ITERATIONS_FILE", raising=False)
    report_iteration(1, rank_seconds=[1.0] * 4, micro_batches=MICRO, tp=1, pp=2, dp=2)
    assert list(tmp_path.iterdir()) == []


def test_the_link_reads_complete_lines_only_and_each_once(tmp_path: Path) -> None:
    table = ProcessTable("n", tmp_path, tmp_path / "lease", 3.0)
    job = LocalJob("j-1", 1, [0], 1, tmp_path)
    link = DetectorLink(Settings(service_addrs={"detector": "127.0.0.1:1"}), table)
    file = tmp_path / "iterations.jsonl"
    file.write_text('{"beat": [0]}\n{"beat": [1')
    assert link._new_lines(job) == [{"beat": [0]}]
    with file.open("a") as f:
        f.write(']}\nnot json\n')
    assert link._new_lines(job) == [{"beat": [1]}]
    assert link._new_lines(job) == []


def test_without_a_detector_address_the_link_does_nothing(tmp_path: Path) -> None:
    link = DetectorLink(Settings(), ProcessTable("n", tmp_path, tmp_path / "lease", 3.0))
    asyncio.run(asyncio.wait_for(link.run_forever(), 1.0))  # returns at once
