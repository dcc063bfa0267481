"""The live re-plan driver's pure parts: the caps follow a rank's new process across a
restart, and the three rates come from the job's own log."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rota.bench import detector_real
from rota.bench.detector_live_replan import LiveRun, rate, summary
from rota.bench.detector_real import _Shares


@dataclass
class _FakeThrottle:
    pids: list[int] = field(default_factory=list)
    limits: list[float | None] = field(default_factory=list)

    def add(self, pid: int) -> None:
        self.pids.append(pid)

    def limit(self, fraction: float | None) -> None:
        self.limits.append(fraction)

    def close(self) -> None:
        pass


def test_a_restarted_ranks_new_process_joins_its_cgroup_under_the_cap_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: dict[str, _FakeThrottle] = {}
    monkeypatch.setattr(detector_real.CpuThrottle, "create",
                        classmethod(lambda cls, name, period_us=0: made.setdefault(name, _FakeThrottle())))
    shares = _Shares(tmp_path, "t", 0.5)
    (tmp_path / "rank1.pid").write_text("100")
    shares.ensure()
    shares.ensure()  # the same process: nothing again
    assert shares.slow(1, 1.5) == pytest.approx(0.5 / 1.5)
    (tmp_path / "rank1.pid").write_text("200")  # the restart's process for rank 1
    shares.ensure()
    (only,) = made.values()
    assert only.pids == [100, 200]
    assert only.limits == [0.5, pytest.approx(0.5 / 1.5)]  # still slow: no cap reset for the new process


def _steps(first: int, last: int, t0: float, per_s: float, loss: float) -> list[dict[str, Any]]:
    return [{"step": s, "t": t0 + (s - first) / per_s, "loss": loss - 0.001 * s, "busy": [0.4, 0.4, 0.4, 0.4]}
            for s in range(first, last + 1)]


def test_the_three_rates_and_the_share_recovered() -> None:
    run = LiveRun(throttled_from=40, load=[1.0, 2.0])
    run.steps = [{"start": 0, "layers": [4, 4, 4, 4]}, *_steps(0, 39, 0.0, 1.0, 3.0), *_steps(40, 71, 40.0, 0.5, 3.0),
                 {"start": 72, "layers": [5, 3, 4, 4]}, *_steps(72, 110, 200.0, 0.8, 3.0)]
    out = summary(run)
    assert (out["before_it_s"], out["slow_it_s"], out["after_it_s"]) == pytest.approx((1.0, 0.5, 0.8))
    assert out["recovered_share"] == pytest.approx(0.6)
    assert out["layers_after"] == [5, 3, 4, 4] and out["restart_step"] == 72
    assert rate(run.segments()[0][1], 5, 500) is None  # a step not seen: no rate
