"""A throttled stage of the real pipeline job is flagged; a killed one is declared stopped.

Real processes only: `examples/pipeline_failslow.py` (4 gloo stages) reports through
`rota.runtime.report_iteration`, the harness puts one stage's process into a cgroup with a
CPU quota (or kills it), and the recorded lines are replayed through the detectors."""

from __future__ import annotations

import os

import pytest

from rota.bench.cpu_throttle import find_backend
from rota.bench.detector_real import BEAT_S, RealFault, run_job
from rota.bench.detector_score import replay
from rota.core.detection.failslow import SLOW, STOP, DetectorConfig

# A run takes ~40 s on a quiet 2-core machine, several minutes when other work shares it.
pytestmark = [pytest.mark.skipif(find_backend() is None or os.geteuid() != 0,
                                 reason="needs root and a cgroup CPU controller"), pytest.mark.timeout(900)]

CONFIG = DetectorConfig(warmup=30)
# A quota slows a process only when it would get more CPU than the quota: on a machine
# oversubscribed several times over, a stage gets less than a quarter of a core anyway.
BUSY = os.getloadavg()[0] / (os.cpu_count() or 1) > 3


@pytest.mark.skipif(BUSY, reason="the machine is oversubscribed: a CPU quota cannot slow a stage that gets less")
def test_a_throttled_stage_is_flagged_and_its_cgroup_removed() -> None:
    rec = run_job(RealFault("slow", rank=2, at=40, factor=2.0), seed=3, iterations=60)
    assert rec.start is not None and rec.start >= 40
    normalized, _, seen = replay(rec.lines, CONFIG, BEAT_S)
    assert seen == 60
    flagged = [v for v in normalized if v.rank == 2 and v.kind == SLOW]
    assert flagged and flagged[0].iteration >= rec.start
    kind, root = find_backend()  # type: ignore[misc]
    assert not [p.name for p in root.iterdir() if p.name.startswith(f"rota-bench-{os.getpid()}-")]


def test_a_killed_stage_is_declared_stopped() -> None:
    rec = run_job(RealFault("stop", rank=1, at=10), seed=4, iterations=40)
    normalized, _, _ = replay(rec.lines, CONFIG, BEAT_S)
    stops = [(v.rank, v.iteration) for v in normalized if v.kind == STOP]
    assert stops and stops[0] == (1, rec.start)
