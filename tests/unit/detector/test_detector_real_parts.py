"""The real-run benchmark's pure parts: the CPU-throttle files, the replay of recorded lines,
pooled scores, the fault injector's stage caps, and the generator's model mismatch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rota.bench.cpu_throttle import V1, V2, CpuUse, find_backend, limit_files, period_for, quota_us
from rota.bench.detector import run
from rota.bench.detector_real import RealFault, Recording, _Injector, _Shares
from rota.bench.detector_real_bench import main as record_main
from rota.bench.detector_score import Pool, replay
from rota.bench.detector_workload import LINK, Fault, parse_config
from rota.core.detection.failslow import JOB, SLOW, STOP, DetectorConfig, Verdict
from rota.core.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[3]


def test_backend_prefers_v2_with_a_cpu_controller(tmp_path: Path) -> None:
    v2, empty, v1 = tmp_path / "v2", tmp_path / "unified", tmp_path / "cpu"
    for d in (v2, empty, v1):
        d.mkdir()
    (empty / "cgroup.controllers").write_text("")  # mounted, but cpu is bound to v1
    (v1 / "cpu.cfs_quota_us").write_text("-1")
    assert find_backend((empty,), v1) == (V1, v1)
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory")
    assert find_backend((v2, empty), v1) == (V2, v2)
    assert find_backend((empty,), tmp_path / "none") is None


def test_limit_files_for_both_versions() -> None:
    assert limit_files(V2, 0.5, 4000) == [("cpu.max", "2000 4000")]
    assert limit_files(V2, None, 4000) == [("cpu.max", "max 4000")]
    assert limit_files(V1, 0.3, 10000) == [("cpu.cfs_period_us", "10000"), ("cpu.cfs_quota_us", "3000")]
    assert limit_files(V1, None, 10000)[-1] == ("cpu.cfs_quota_us", "-1")
    assert quota_us(0.1, 4000) == 1000  # the kernel's floor
    with pytest.raises(ValueError, match="fraction"):
        quota_us(1.5)


@pytest.mark.parametrize(("fraction", "period"), [(1.0, 4000), (0.25, 4000), (0.2, 5000), (0.107, 10000), (0.02, 50000)])
def test_the_period_grows_so_the_quota_stays_over_the_kernels_floor(fraction: float, period: int) -> None:
    assert period_for(fraction) == period
    assert quota_us(fraction, period_for(fraction)) >= 1000
    assert quota_us(fraction, period_for(fraction)) / period_for(fraction) == pytest.approx(fraction, rel=0.08)


def test_cpu_use_is_cpu_time_over_wall_time() -> None:
    before, after = CpuUse(1_000, 50), CpuUse(301_000, 90)
    assert after.rate_since(before, 1_200_000) == pytest.approx(0.25)
    assert after.rate_since(before, 0) == 0.0


def _line(it: int, seconds: list[float], lengths: list[list[int]]) -> dict[str, Any]:
    return {"iteration": it, "rank_seconds": seconds, "micro_batches": [lengths],
            "layout": {"tp": 1, "pp": 2, "dp": 1}, "iteration_seconds": sum(seconds)}


def test_replay_flags_a_slow_rank_and_a_silent_one() -> None:
    lines: list[tuple[float, dict[str, Any]]] = []
    t = 0.0
    for it in range(80):
        lengths = [[100 + (it * 37) % 200, 50], [300]]
        cost = sum(n for mb in lengths for n in mb) * 1e-4 + sum(n * n for mb in lengths for n in mb) * 1e-7
        lines.append((t, _line(it, [cost, cost * (1.5 if it >= 60 else 1.0)], lengths)))
        t += 0.1
    for _ in range(20):  # rank 0 keeps beating, rank 1 is silent
        lines.append((t, {"beat": [0]}))
        t += 0.1
    normalized, raw, seen = replay(lines, DetectorConfig(warmup=20), beat_s=0.25)
    assert seen == 80
    assert [(v.rank, v.kind) for v in normalized] == [(1, SLOW), (1, STOP)]
    assert normalized[0].iteration == 64 and normalized[1].iteration == 80
    assert (1, STOP) in [(v.rank, v.kind) for v in raw]


def test_pool_counts_false_alarms_and_delays_over_runs() -> None:
    pool = Pool()
    fault = Fault(SLOW, 2, 100)
    pool.add([Verdict(2, SLOW, 104, 1.3), Verdict(1, SLOW, 50, 1.2)], [fault], 200, grace=5)
    pool.add([], [], 300, grace=5)
    s = pool.scores()
    assert (s["precision"], s["recall"], s["false_alarms_per_1k"], s["mean_delay_iters"]) == (0.5, 1.0, 2.0, 4)


def _mismatch(**changes: Any) -> dict[str, Any]:
    base = json.loads((REPO / "bench" / "detector" / "config.json").read_text())
    return {**base, "iterations": 600, "faults": [], **changes}


def test_a_slow_link_is_the_jobs_and_is_found() -> None:
    cfg = parse_config(_mismatch(iterations=300, faults=[{"kind": LINK, "stage": 1, "seconds": 0.3, "from_iter": 150}]))
    assert cfg.scored_faults() == (Fault(SLOW, JOB, 150, None, 0.3),)
    result = run(cfg)
    kinds = {(v["rank"], v["kind"]) for v in result["normalized"]["verdicts"]}
    assert (JOB, SLOW) in kinds and result["normalized"]["recall"] == 1.0


@pytest.mark.parametrize(("change", "field"), [
    ({"faults": [{"kind": LINK, "stage": 3, "seconds": 0.1, "from_iter": 1}]}, "faults[0].stage"),
    ({"faults": [{"kind": LINK, "stage": 0, "seconds": 0, "from_iter": 1}]}, "faults[0].seconds"),
    ({"mismatch": {"jitter": -0.1}}, "mismatch.jitter"),
    ({"mismatch": {"cubic": "big"}}, "mismatch.cubic"),
])
def test_bad_mismatch_fields_are_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_config(_mismatch(**change))
    assert err.value.field == field


def test_mismatch_changes_the_times_but_not_the_matched_stream() -> None:
    plain = run(parse_config(_mismatch(iterations=80)))
    same = run(parse_config(_mismatch(iterations=80, mismatch={"jitter": 0.0, "cubic": 0.0})))
    assert plain["normalized"]["verdicts"] == same["normalized"]["verdicts"]
    cubic = parse_config(_mismatch(iterations=120, mismatch={"cubic": 2.0}))
    assert cubic.cubic == 2.0 and cubic.jitter == 0.0


def test_bloom_replay_alarms_only_after_the_drop() -> None:
    from rota.bench.bloom_replay import run as bloom

    result = bloom()
    for row in result["published"] + result["held"]:
        assert row["false_alarms"] == 0  # the healthy windows, the loss spike included
        assert row["alarm_at"] is None or row["alarm_at"] >= result["first_slow"]
    default = next(r for r in result["held"] if r["threshold"] == 1.1)
    assert default["alarm_at"] is None  # a 5% slowdown of the whole step is under the default threshold
    assert any(r["alarm_at"] is not None for r in result["held"])


class _FakeShares(_Shares):
    """The stages' caps without cgroups: records each cap set."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"), "test", 0.5)
        self.set: list[tuple[int, float]] = []

    def slow(self, rank: int, factor: float) -> float:
        self.set.append((rank, factor))
        return self.share / factor


def test_a_transient_divides_the_stage_cap_by_the_factor_then_restores_it() -> None:
    shares, rec = _FakeShares(), Recording()
    inject = _Injector(RealFault("transient", rank=2, at=10, factor=1.5, length=3), Path("/nonexistent"), shares, rec)
    for it in range(20):
        inject.on_iteration(it, float(it))
    assert (rec.start, rec.end) == (10, 13)
    assert shares.set == [(2, 1.5), (2, 1.0)]
    assert rec.quotas == [(9, pytest.approx(0.3333, abs=1e-4)), (12, 0.5)]


def test_a_persistent_throttle_and_no_fault_leave_the_caps_as_set() -> None:
    shares, slow, none = _FakeShares(), Recording(), Recording()
    for fault, rec in ((RealFault("slow", rank=1, at=5, factor=1.2), slow), (RealFault("none"), none)):
        inject = _Injector(fault, Path("/nonexistent"), shares, rec)
        for it in range(30):
            inject.on_iteration(it, float(it))
    assert (slow.start, slow.end, none.start) == (5, None, None)
    assert shares.set == [(1, 1.2)]


def test_the_recording_command_names_a_bad_field(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, field in ((["--seeds", "a"], "--seeds"), (["--case", "nope"], "--case")):
        with pytest.raises(SystemExit):
            record_main(argv)
        assert field in capsys.readouterr().err
