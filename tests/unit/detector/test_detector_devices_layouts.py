"""Applying a re-plan and keeping bad devices out of the plan: the pure parts.

Which verdicts take a device out of the plan, the refusal of a job that does not accept
layout changes, the layout document a restarted job reads (ROTA_LAYOUT) through the
agent's check and rota.runtime, the job-file flag, and the CLI's parsing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rota.agent.service import MAX_LAYOUT_BYTES, check_layout
from rota.cli.detector_commands import clear_targets, devices, parse_device, replan_text
from rota.cli.main import HANDLERS, build_parser
from rota.client import DeviceHealth, Gpu, InvalidArgumentError, Node, ReplanResult, job_spec_from_mapping
from rota.client._wire import spec_to_proto
from rota.common import convert
from rota.core.detection.devices import BEYOND_REPAIR_RATIO, check_beyond_repair, mark_for
from rota.core.detection.failslow import JOB, SLOW, STOP, Verdict
from rota.core.detection.layout import Layout
from rota.core.detection.replan import layout_document, replan, require_accepts
from rota.core.errors import FailedPrecondition, InvalidArgument
from rota.core.jobspec import JobSpecData
from rota.runtime import layout as runtime_layout

STOPPED = Verdict(3, STOP, 120, 1.2, {"why": "rank 3 missed heartbeats for 3.6s (timeout 3s)"})

MARKS: list[tuple[str, Verdict, str | None, int | None, str | None]] = [
    ("a rank declared dead marks its GPU", STOPPED, "n1", 3, "stop: rank 3 missed heartbeats"),
    ("a rank slow beyond repair marks its GPU", Verdict(1, SLOW, 80, 2.4), "n1", 1, "ran 2.40x its expected time"),
    ("a slowdown at exactly the limit is beyond repair", Verdict(1, SLOW, 80, BEYOND_REPAIR_RATIO), "n1", 1, "slow:"),
    ("a mild slowdown is left to the re-plan", Verdict(1, SLOW, 80, 1.3), "n1", 1, None),
    ("a rank without a GPU of its own marks nothing", STOPPED, "n1", None, None),
    ("a rank whose node is unknown marks nothing", STOPPED, None, 3, None),
    ("a verdict on the whole job marks nothing", Verdict(JOB, STOP, 5, 1.5), "n1", 0, None),
]


@pytest.mark.parametrize(("verdict", "node", "gpu", "reason"), [c[1:] for c in MARKS], ids=[c[0] for c in MARKS])
def test_which_verdicts_take_a_device_out_of_the_plan(verdict: Verdict, node: str | None, gpu: int | None,
                                                       reason: str | None) -> None:
    mark = mark_for(verdict, "j-1", node, gpu)
    if reason is None:
        assert mark is None
        return
    assert mark is not None
    assert (mark.node, mark.gpu, mark.job_id, mark.rank, mark.kind) == (node, gpu, "j-1", verdict.rank, verdict.kind)
    assert reason in mark.reason


def test_the_beyond_repair_ratio_must_be_a_slowdown() -> None:
    assert check_beyond_repair(1.5) == 1.5
    for bad in (1.0, 0.5, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument) as err:
            check_beyond_repair(bad)
        assert err.value.field == "beyond_repair"


def test_a_job_that_does_not_accept_layout_changes_is_refused_naming_the_flag() -> None:
    require_accepts("j-1", True)
    with pytest.raises(FailedPrecondition, match="accepts_layout_changes"):
        require_accepts("j-1", False)


def test_the_layout_document_holds_what_a_restarted_job_needs_and_reads_back_through_the_runtime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    speeds = [1.0] * 16
    speeds[5] = 1 / 1.3
    plan = replan(Layout(2, 4, 2), speeds, layers=32, microbatches=8)
    doc = layout_document(plan, layers=32, microbatches=8, speeds=speeds, from_epoch=41)
    assert (doc["tp"], doc["pp"], doc["dp"], doc["layers"], doc["microbatches"], doc["from_epoch"]) == (2, 4, 2, 32, 8, 41)
    layers = doc["layers_per_stage"]
    assert isinstance(layers, list) and sum(layers[:4]) == 32 and layers[2] < 8  # rank 5's stage sheds layers
    assert doc["device_speeds"] == [round(v, 6) for v in speeds]
    text = json.dumps(doc, sort_keys=True)
    check_layout(text)  # the agent passes it on as it is
    monkeypatch.setenv("ROTA_LAYOUT", text)
    assert runtime_layout() == json.loads(text)
    monkeypatch.delenv("ROTA_LAYOUT")
    assert runtime_layout() is None


BAD_LAYOUTS = [
    ("text that is not JSON", "{tp: 2"),
    ("JSON that is not an object", "[1, 2]"),
    ("a layout too large for an environment variable", json.dumps({"x": "a" * MAX_LAYOUT_BYTES})),
    ("a NUL character", '{"a": "\x00"}'),
]


@pytest.mark.parametrize("text", [c[1] for c in BAD_LAYOUTS], ids=[c[0] for c in BAD_LAYOUTS])
def test_the_agent_refuses_a_layout_a_job_could_not_read(text: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_layout(text)
    assert err.value.field == "layout"


def test_the_runtime_names_a_malformed_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROTA_LAYOUT", "[1]")
    with pytest.raises(ValueError, match="ROTA_LAYOUT"):
        runtime_layout()


def test_the_job_file_flag_reaches_the_stored_spec_and_back() -> None:
    spec = job_spec_from_mapping({"name": "pp", "tenant": "t", "command": ["true"], "accepts_layout_changes": True})
    assert spec.accepts_layout_changes
    data = convert.spec_from_proto(spec_to_proto(spec))
    assert data.accepts_layout_changes and JobSpecData.from_dict(data.to_dict()).accepts_layout_changes
    assert convert.spec_to_proto(data).accepts_layout_changes
    assert not JobSpecData.from_dict({"name": "old"}).accepts_layout_changes  # specs stored before the flag
    with pytest.raises(InvalidArgumentError) as err:
        job_spec_from_mapping({"command": ["true"], "accepts_layout_changes": "yes"})
    assert err.value.field == "accepts_layout_changes"


DEVICES: list[tuple[str, list[str], dict[str, list[int]]]] = [
    ("one device", ["node-1:3"], {"node-1": [3]}),
    ("a slash works like a colon", ["node-1/3"], {"node-1": [3]}),
    ("several devices of one node, repeated", ["n:2", "n:0", "n:2"], {"n": [0, 2]}),
    ("a bare node clears all of its devices", ["n:2", "n"], {"n": []}),
    ("node names may hold colons", ["rack:a:1"], {"rack:a": [1]}),
]


@pytest.mark.parametrize(("texts", "want"), [c[1:] for c in DEVICES], ids=[c[0] for c in DEVICES])
def test_devices_to_clear_parse_per_node(texts: list[str], want: dict[str, list[int]]) -> None:
    assert clear_targets(texts) == want


@pytest.mark.parametrize("text", ["", ":1", "n:x", "n:-1"])
def test_a_device_that_does_not_parse_names_the_flag(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        parse_device(text)
    assert err.value.field == "clear"


def test_replan_health_clear_parse_with_their_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["replan", "j-1", "--apply", "--wait", "30", "--json"])
    assert (args.command, args.job_id, args.apply, args.wait, args.json) == ("replan", "j-1", True, 30.0, True)
    assert not parser.parse_args(["replan", "j-1"]).apply
    args = parser.parse_args(["health", "--clear", "n:1", "--clear", "m", "--reason", "reseated"])
    assert (args.clear, args.reason) == (["n:1", "m"], "reseated")
    assert {"replan", "health"} <= set(HANDLERS)


def _bad(node: str, gpu: int, **kw: Any) -> DeviceHealth:
    base: dict[str, Any] = {"node": node, "gpu": gpu, "state": "BAD", "reason": "stop: quiet", "job_id": "j-1", "rank": 0,
                            "kind": "stop", "since": None, "cleared": None}
    return DeviceHealth(**{**base, **kw})


def test_health_shows_which_devices_are_out_of_the_plan() -> None:
    gpus = [Gpu(0, "u0", "virtual", True, ""), Gpu(1, "u1", "virtual", True, "")]
    nodes = [Node(name="n", address="a", health="ALIVE", gpus=gpus, last_heartbeat=None)]
    out = devices(nodes, [], [_bad("n", 1), _bad("n", 0, state="CLEARED")])
    assert [(d["gpu"], d["state"], d["bad_reason"]) for d in out] == [(0, "OK", None), (1, "BAD", "stop: quiet")]


def test_an_applied_replan_reads_as_where_the_job_restarts() -> None:
    result = ReplanResult(
        layout={"tp": 2, "pp": 2, "dp": 1}, device_speeds=[1, 1, 0.5, 1], stages=[], layers_per_stage=[10, 6],
        microbatches_per_replica=[8], idle_ranks=[], throughput_before=0.5, throughput_after=0.8,
        throughput_drop_group=0.0, applied=True, applied_layout={"tp": 2}, image_id="img-1", step=42,
        from_node="n1", node="n2",
    )
    text = replan_text(result)
    assert "checkpointed at step 42 (image img-1) on n1; restarted on n2" in text
    assert "not applied" in replan_text(ReplanResult(**{**result.to_dict(), "applied": False}))
