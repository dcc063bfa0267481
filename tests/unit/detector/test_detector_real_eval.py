"""Saved real runs: their faults, the transient's marks, and a save/load round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from rota.bench.detector_real_eval import SavedRun, faults_of, load, save, transient_marks
from rota.core.detection.failslow import SLOW, STOP, Verdict

WINDOWS = [
    {"kind": "transient", "rank": 2, "factor": 1.5, "start": 68, "end": 71},
    {"kind": "slow", "rank": 2, "factor": 1.2, "start": 95, "end": None},
]


def run(windows: list[dict[str, object]]) -> SavedRun:
    return SavedRun("t", 0, [(0.0, {"iteration": 0})], windows, (1.0, 2.0))


def test_only_slow_and_stop_windows_are_faults_to_find() -> None:
    faults = faults_of(run([*WINDOWS, {"kind": "stop", "rank": 1, "start": 40, "end": None},
                            {"kind": "slow", "rank": 3, "start": None, "end": None}]))
    assert [(f.kind, f.rank, f.start) for f in faults] == [(SLOW, 2, 95), (STOP, 1, 40)]


@pytest.mark.parametrize(("verdicts", "marks"), [
    ([], 0),
    ([Verdict(2, SLOW, 70, 1.5)], 1),  # during the transient
    ([Verdict(2, SLOW, 90, 1.5)], 1),  # after it, before the next fault: still its doing
    ([Verdict(2, SLOW, 100, 1.2)], 0),  # the persistent fault's verdict
    ([Verdict(1, SLOW, 70, 1.5), Verdict(2, STOP, 70, 2.0)], 0),  # another rank, another kind
    ([Verdict(2, SLOW, 60, 1.5)], 0),  # before it
])
def test_a_transient_marks_its_rank_from_its_start_to_the_next_fault(verdicts: list[Verdict], marks: int) -> None:
    assert transient_marks(verdicts, run(WINDOWS)) == marks


def test_saved_runs_load_back(tmp_path: Path) -> None:
    save(tmp_path, "slow 1.5x", 3, [(1.5, {"iteration": 0, "rank_seconds": [0.1]})], WINDOWS, (4.0, 5.0))
    (back,) = load(tmp_path)
    assert (back.name, back.seed, back.windows, back.load) == ("slow 1.5x", 3, WINDOWS, (4.0, 5.0))
    assert back.lines == [(1.5, {"iteration": 0, "rank_seconds": [0.1]})]


def test_gzipped_runs_in_folders_load_too(tmp_path: Path) -> None:
    import gzip
    import json

    (tmp_path / "batch").mkdir()
    record = {"name": "n", "seed": 7, "windows": [], "load": [1, 2], "lines": [[0.5, {"beat": [0]}]]}
    (tmp_path / "batch" / "n.json.gz").write_bytes(gzip.compress(json.dumps(record).encode()))
    (back,) = load(tmp_path)
    assert (back.seed, back.lines) == (7, [(0.5, {"beat": [0]})])
