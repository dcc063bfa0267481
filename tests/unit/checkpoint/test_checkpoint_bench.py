"""`rota bench checkpoint`'s JSON shape and table: the medians the issue pins, with their
min and max, the added baselines, ratios against the best baseline of the case, and a
restore's breakdown from the job's own marks."""

from __future__ import annotations

import pytest

from rota.bench.checkpoint import cases_of, parse_args
from rota.bench.checkpoint_report import BREAKDOWN, Case, add_breakdown, best, render


def measured() -> Case:
    case = Case(50.0, 4)
    case.pause, case.durable, case.restore, case.migrate = [0.2, 0.1, 0.3], [0.5, 0.4, 0.9], [1.0, 0.5, 1.5], [2.0] * 3
    case.save, case.load, case.load_mmap = [1.0, 1.2, 0.8], [2.5] * 3, [2.0] * 3
    case.load_prestarted, case.st_save, case.st_load = [1.6, 1.5, 1.4], [0.9] * 3, [2.4] * 3
    case.dcp_async_block = [0.05, 0.07, 0.06]
    for launched in (100.0, 200.0, 300.0):
        add_breakdown(case, {"step": 9, "t_restore": launched + 0.5, "t_ready": launched + 0.5,
                             "t_loaded": launched + 0.75, "t_step": launched + 0.8}, launched)
    return case


def test_a_case_keeps_its_keys_and_adds_the_baselines() -> None:
    out = measured().to_dict()
    assert (out["pause_s"], out["restore_s"], out["migrate_s"], out["durable_s"]) == (0.2, 1.0, 2.0, 0.5)
    assert out["baseline"] == {"save_s": 1.0, "load_s": 2.5, "load_mmap_s": 2.0, "load_prestarted_s": 1.5,
                               "load_prestarted_copy_s": 0.0, "safetensors_save_s": 0.9,
                               "safetensors_load_s": 2.4, "safetensors_prestarted_s": 0.0, "bytes": 0}
    assert out["dcp"] == {"async_block_s": 0.06}
    assert out["restore_breakdown"] == {"process_start_s": 0.5, "state_transfer_s": 0.0, "rebuild_s": 0.25,
                                        "first_step_s": 0.05}
    assert out["spread"]["restore_s"] == [0.5, 1.5] and out["spread"]["load_prestarted_s"] == [1.4, 1.6]
    assert out["repeats"] == 3


def test_the_ratios_are_against_the_best_baseline_of_the_case() -> None:
    out = measured().to_dict()
    # Restore: the pre-started loader (1.5 s) beats torch.load (2.5 s), mmap (2.0 s), safetensors (2.4 s).
    assert out["best_baseline"]["restore"] == "pre-started torch.load(mmap)" and out["restore_x"] == 1.5
    # Migrate: torch.save + the pre-started loader, 2.5 s, beats safetensors' 0.9 + 2.4 s.
    assert out["best_baseline"]["migrate"] == "torch.save + pre-started torch.load(mmap)"
    assert out["best_baseline"]["migrate_s"] == 2.5 and out["migrate_x"] == 1.25


def test_an_unmeasured_baseline_never_counts_as_the_best() -> None:
    assert best({"a": 0.0, "b": 2.0, "c": 3.0}) == ("b", 2.0)
    assert best({"a": 0.0}) == ("", 0.0)
    assert Case(8.0, 1).to_dict()["restore_x"] == 0.0


def test_a_save_and_load_pair_counts_for_migration_only_with_both_measured() -> None:
    case = measured()
    case.load, case.load_mmap, case.st_load = [], [], []  # cold loaders not measured (--quick)
    case.st_prestarted = [0.3]
    out = case.to_dict()
    assert out["best_baseline"]["migrate"] == "safetensors, pre-started" and out["best_baseline"]["migrate_s"] == 1.2
    assert out["best_baseline"]["restore"] == "pre-started safetensors" and out["restore_x"] == 0.3


def test_the_table_prints_min_and_max_beside_each_median_and_the_breakdown() -> None:
    table = render([measured().to_dict()])
    assert "1.000s [0.500-1.500]" in table  # restore: median [min-max]
    assert "0.060s [0.050-0.070]" in table  # dcp.async_save's blocking
    assert "process start 0.500s" in table and "rebuild 0.250s" in table
    assert "restore pre-started torch.load(mmap)" in table


def test_a_report_without_the_marks_adds_no_breakdown() -> None:
    case = Case(8.0, 1)
    add_breakdown(case, {"step": 3}, 100.0)
    assert all(not v for v in case.breakdown.values())
    assert case.to_dict()["restore_breakdown"] == dict.fromkeys(BREAKDOWN, 0.0)


def test_sizes_and_ranks_make_the_cases_and_bad_ones_name_the_flag() -> None:
    assert [(c.state_mb, c.ranks) for c in cases_of(parse_args([]))] == [(500.0, 1), (500.0, 4), (2048.0, 1),
                                                                          (2048.0, 4)]
    assert [(c.state_mb, c.ranks) for c in cases_of(parse_args(["--quick", "--ranks", "1"]))] == [(8.0, 1)]
    for argv, flag in ((["--sizes", "5x"], "--sizes"), (["--ranks", "one"], "--ranks"), (["--repeats", "0"], "--repeats"),
                       (["--sizes", "-1"], "--sizes")):
        with pytest.raises(SystemExit, match=flag):
            cases_of(parse_args(argv))
