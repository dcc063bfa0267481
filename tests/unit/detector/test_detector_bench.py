"""`rota bench detector`: the config shape, the generator, the scores and the JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rota.bench.detector import score
from rota.bench.detector_workload import Fault, Generator, parse_config
from rota.cli.main import main as rota_main
from rota.core.detection.failslow import SLOW, STOP, Verdict
from rota.core.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = json.loads((REPO / "bench" / "detector" / "config.json").read_text())


def small(**changes: Any) -> dict[str, Any]:
    return {**EXAMPLE, "iterations": 600,
            "faults": [{"kind": "slow", "rank": 5, "factor": 1.2, "from_iter": 200},
                       {"kind": "stop", "rank": 9, "at_iter": 450}], **changes}


@pytest.mark.parametrize(("change", "field"), [
    ({"seed": "7"}, "seed"),
    ({"layout": {"tp": 2, "pp": 4}}, "layout.dp"),
    ({"seq_len": {"median": 2048, "sigma": 1.0}}, "seq_len.max"),
    ({"noise": -0.1}, "noise"),
    ({"faults": [{"kind": "slow", "rank": 16, "factor": 1.3, "from_iter": 1}]}, "faults[0].rank"),
    ({"faults": [{"kind": "slow", "rank": 1, "factor": 0.9, "from_iter": 1}]}, "faults[0].factor"),
    ({"faults": [{"kind": "melt", "rank": 1}]}, "faults[0].kind"),
    ({"iterations": 0}, "iterations"),
    ({"layout": {"tp": 0, "pp": 4, "dp": 2}}, "layout.tp"),
    ({"layout": [2, 4, 2]}, "layout"),
    ({"microbatches": "8"}, "microbatches"),
    ({"seq_len": {"median": 2048, "sigma": -1.0, "max": 32768}}, "seq_len.sigma"),
    ({"seq_len": {"median": 2048, "sigma": 1.0, "max": 1024}}, "seq_len.max"),
    ({"tokens_per_microbatch": 0}, "tokens_per_microbatch"),
    ({"noise": float("nan")}, "noise"),
    ({"noise": 1.0}, "noise"),
    ({"trials": 0}, "trials"),
    ({"hiccup_rate": 1}, "hiccup_rate"),
    ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
    ({"layers": 2}, "layers"),
    ({"detector": {"threshold": 0.9}}, "detector.threshold"),
    ({"detector": {"treshold": 1.2}}, "detector.treshold"),
    ({"faults": {"kind": "stop"}}, "faults"),
    ({"faults": ["stop"]}, "faults[0]"),
    ({"faults": [{"kind": "slow", "rank": 1, "factor": 1.3}]}, "faults[0].from_iter"),
    ({"faults": [{"kind": "slow", "rank": 1, "factor": 1.3, "from_iter": 1, "to_iter": "end"}]}, "faults[0].to_iter"),
    ({"faults": [{"kind": "stop", "rank": 1, "at_iter": 5, "factor": 2}]}, "faults[0].factor"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_config_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_config({**EXAMPLE, **change})
    assert err.value.field == field


def test_the_generator_packs_micro_batches_within_the_token_budget_and_stops_a_rank() -> None:
    cfg = parse_config(small())
    steps = list(Generator(cfg, seed=1))
    assert len(steps) == 600
    first = steps[0].report
    assert len(first.micro_batches) == 2 and all(len(r) == 8 for r in first.micro_batches)
    for mb in (mb for r in first.micro_batches for mb in r):
        assert sum(mb) <= cfg.tokens_per_microbatch or len(mb) == 1
    assert all(s is not None for s in steps[449].report.rank_seconds)
    after = steps[450]
    assert set(after.stopped_at) == {9}
    assert [r for r, s in enumerate(after.report.rank_seconds) if s is None] == list(range(8, 16))  # replica 1 left
    assert steps[10].end_s < steps[11].end_s


def test_scores_count_correct_verdicts_false_alarms_and_delays() -> None:
    faults = [Fault(SLOW, 5, 100, None, 1.3), Fault(STOP, 9, 300)]
    runs = [[Verdict(5, SLOW, 104, 1.3), Verdict(2, SLOW, 150, 1.2), Verdict(9, STOP, 302, 1.1)],
            [Verdict(9, STOP, 301, 1.1)]]
    assert score(runs, faults, iterations=1000, grace=5) == {
        "precision": 0.75, "recall": 0.75, "false_alarms_per_1k": 0.5, "mean_delay_iters": pytest.approx(2.33, abs=0.01),
    }


def test_bench_json_has_the_issue_shape_and_normalised_beats_raw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps(small()))
    with pytest.raises(SystemExit) as done:
        rota_main(["bench", "detector", "--config", str(config), "--json"])
    assert done.value.code == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("normalized", "raw"):
        assert {"precision", "recall", "false_alarms_per_1k", "mean_delay_iters", "verdicts"} <= set(out[name])
        assert all(set(v) == {"rank", "kind", "iteration"} for v in out[name]["verdicts"])
    norm, raw = out["normalized"], out["raw"]
    assert (norm["precision"], norm["recall"], norm["false_alarms_per_1k"]) == (1.0, 1.0, 0.0)
    assert {(v["rank"], v["kind"]) for v in norm["verdicts"]} == {(5, "slow"), (9, "stop")}
    assert raw["false_alarms_per_1k"] > norm["false_alarms_per_1k"]
    last = out["replan"][-1]
    assert last["throughput_before"] == 0.0 and last["throughput_after"] > last["throughput_drop_group"]


def test_a_missing_config_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        rota_main(["bench", "detector", "--config", str(tmp_path / "none.json")])
    assert done.value.code != 0
    assert "none.json" in capsys.readouterr().err
