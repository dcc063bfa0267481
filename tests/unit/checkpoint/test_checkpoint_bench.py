"""`rota bench checkpoint`'s JSON shape and table: the medians the issue pins, with their
min and max, and a restore's breakdown from the job's own marks."""

from __future__ import annotations

from rota.bench.checkpoint import BREAKDOWN, Case, add_breakdown, render


def measured() -> Case:
    case = Case(50.0, 4)
    case.pause, case.durable, case.restore, case.migrate = [0.2, 0.1, 0.3], [0.5, 0.4, 0.9], [2.0, 1.0, 3.0], [4.0] * 3
    case.save, case.load = [1.0, 1.2, 0.8], [2.5] * 3
    case.dcp_save, case.dcp_async_block, case.dcp_load = [1.5] * 3, [0.05, 0.07, 0.06], [2.2] * 3
    for launched in (100.0, 200.0, 300.0):
        add_breakdown(case, {"step": 9, "t_restore": launched + 1.5, "t_ready": launched + 1.5,
                             "t_loaded": launched + 1.75, "t_step": launched + 1.8}, launched)
    return case


def test_a_case_keeps_its_shape_and_adds_durable_dcp_breakdown_and_spread() -> None:
    out = measured().to_dict()
    assert (out["pause_s"], out["restore_s"], out["migrate_s"]) == (0.2, 2.0, 4.0)
    assert out["baseline"] == {"save_s": 1.0, "load_s": 2.5, "bytes": 0}
    assert out["durable_s"] == 0.5
    assert out["dcp"] == {"save_s": 1.5, "async_block_s": 0.06, "load_s": 2.2}
    assert set(out["restore_breakdown"]) == set(BREAKDOWN)
    assert out["restore_breakdown"] == {"process_start_s": 1.5, "state_transfer_s": 0.0, "rebuild_s": 0.25,
                                        "first_step_s": 0.05}
    assert out["spread"]["restore_s"] == [1.0, 3.0] and out["spread"]["dcp_async_block_s"] == [0.05, 0.07]
    assert out["repeats"] == 3


def test_the_table_prints_min_and_max_beside_each_median_and_the_breakdown() -> None:
    table = render([measured().to_dict()])
    assert "2.000s [1.000-3.000]" in table  # restore: median [min-max]
    assert "0.060s [0.050-0.070]" in table  # dcp.async_save's blocking
    assert "process start 1.500s" in table and "rebuild 0.250s" in table


def test_a_report_without_the_marks_adds_no_breakdown() -> None:
    case = Case(8.0, 1)
    add_breakdown(case, {"step": 3}, 100.0)
    assert all(not v for v in case.breakdown.values())
    assert case.to_dict()["restore_breakdown"] == dict.fromkeys(BREAKDOWN, 0.0)
