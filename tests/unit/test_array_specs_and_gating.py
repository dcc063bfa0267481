"""Job arrays and dependencies in the pure core: the index syntax, dependency validation,
cycles, and the gate the allocator asks every plan (held back with a reason, or failed)."""

from __future__ import annotations

from typing import Any

import pytest

from rota.core import jobstate as js
from rota.core.arrays import parse_array, task_environment, task_id
from rota.core.dependencies import Queued, array_state, find_cycle, gate, outcome, validate
from rota.core.errors import InvalidArgument
from rota.core.jobspec import JobSpecData
from rota.core.jobspec import validate as validate_spec


@pytest.mark.parametrize(("text", "indices", "cap"), [
    ("0-3", (0, 1, 2, 3), 0),
    ("0-99%4", tuple(range(100)), 4),
    ("0-9:3", (0, 3, 6, 9), 0),
    ("1,3,5-7", (1, 3, 5, 6, 7), 0),
    ("7", (7,), 0),
    ("2-2%1", (2,), 1),
    (" 0 - 2 ", (0, 1, 2), 0),
])
def test_array_syntax(text: str, indices: tuple[int, ...], cap: int) -> None:
    parsed = parse_array(text)
    assert parsed.indices == indices and parsed.max_running == cap


@pytest.mark.parametrize(("text", "kwargs", "says"), [
    ("", {}, "no indices"),
    ("%4", {}, "no indices"),
    ("5-2", {}, "reversed"),
    ("0-10", {"cap": 10}, "more than 10 tasks"),
    ("0-999999", {"cap": 100_000}, "more than 100000 tasks"),
    ("0-999999999", {}, "is above"),
    ("1,2,2", {}, "index 2 is given twice"),
    ("0-3:0", {}, "step"),
    ("a-b", {}, "cannot read"),
    ("-3", {}, "cannot read"),
    ("0-3%0", {}, "%K"),
    ("0-3%x", {}, "%K"),
    ("0-3%2", {"max_running": 3}, "disagree"),
])
def test_bad_arrays_are_refused_naming_the_field(text: str, kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_array(text, **kwargs)
    assert err.value.field == "array" and says in str(err.value)


def test_max_running_from_the_field_when_the_text_has_none() -> None:
    assert parse_array("0-3", max_running=2).max_running == 2
    assert parse_array("0-3%2", max_running=2).max_running == 2


def test_a_task_is_named_and_sees_its_index_as_slurm_does() -> None:
    assert task_id("j-00aa", 7) == "j-00aa_7"
    assert task_environment("j-00aa", 7) == {"ROTA_ARRAY_ID": "j-00aa", "ROTA_ARRAY_INDEX": "7",
                                             "SLURM_ARRAY_JOB_ID": "j-00aa", "SLURM_ARRAY_TASK_ID": "7"}


# Dependencies: validation (shape; the api checks that parents exist).
def test_dependencies_are_normalised() -> None:
    assert validate([{"job": "j-1"}, {"job": "j-2", "when": "finished"}]) == [
        {"job": "j-1", "when": "succeeded"}, {"job": "j-2", "when": "finished"}]


@pytest.mark.parametrize(("raw", "field"), [
    ([{"job": ""}], "depends_on[0].job"),
    ([{"job": "j-1"}, {"job": "j-2", "when": "afterok"}], "depends_on[1].when"),
    ([{"job": "j-1"}, {"job": "j-1", "when": "failed"}], "depends_on[1].job"),
    (["j-1"], "depends_on[0]"),
    ([{"job": "j-" + "x" * 40}], "depends_on[0].job"),
    ([{"job": f"j-{i}"} for i in range(65)], "depends_on"),
])
def test_bad_dependencies_name_the_field(raw: list[Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate(raw)
    assert err.value.field == field


def test_the_spec_validation_checks_depends_on() -> None:
    spec = JobSpecData(name="b", tenant="t", kind="training", priority=5, gpus=1, command=["true"],
                       depends_on=[{"job": "j-1", "when": "nope"}])
    with pytest.raises(InvalidArgument) as err:
        validate_spec(spec, max_gpus_per_node=0)
    assert err.value.field == "depends_on[0].when"


@pytest.mark.parametrize(("when", "state", "expected"), [
    ("succeeded", js.RUNNING, "waits"), ("succeeded", js.PENDING, "waits"), ("succeeded", js.LOST, "waits"),
    ("succeeded", js.SUCCEEDED, "holds"), ("succeeded", js.FAILED, "never"), ("succeeded", js.CANCELLED, "never"),
    ("finished", js.SUCCEEDED, "holds"), ("finished", js.FAILED, "holds"), ("finished", js.CANCELLED, "holds"),
    ("failed", js.FAILED, "holds"), ("failed", js.CANCELLED, "holds"), ("failed", js.SUCCEEDED, "never"),
    ("succeeded", None, "never"),
])
def test_condition_outcomes(when: str, state: str | None, expected: str) -> None:
    assert outcome(when, state) == expected


@pytest.mark.parametrize(("counts", "state"), [
    ({js.SUCCEEDED: 3}, js.SUCCEEDED),
    ({js.SUCCEEDED: 2, js.RUNNING: 1}, js.PENDING),
    ({js.SUCCEEDED: 2, js.FAILED: 1}, js.FAILED),
    ({js.SUCCEEDED: 2, js.CANCELLED: 1}, js.CANCELLED),
])
def test_an_array_as_a_parent(counts: dict[str, int], state: str) -> None:
    assert array_state(counts) == state


@pytest.mark.parametrize(("edges", "cycle"), [
    ({"a": ["b"], "b": ["c"], "c": []}, None),
    ({"a": ["b", "c"], "b": ["c"], "c": []}, None),  # a diamond is no cycle
    ({"a": ["b"], "b": ["a"]}, ["a", "b", "a"]),
    ({"a": ["a"]}, ["a", "a"]),
    ({"x": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
])
def test_cycles_are_found(edges: dict[str, list[str]], cycle: list[str] | None) -> None:
    assert find_cycle(edges) == cycle


# The gate: what the allocator holds back or fails, in arrival order.
def task(array: str, i: int, *deps: tuple[str, str]) -> Queued:
    return Queued(f"{array}_{i}", array, tuple(deps))


def test_an_array_runs_at_most_k_tasks_at_once() -> None:
    queue = [task("j-a", i) for i in range(6)]
    out = gate(queue, {}, running={"j-a": 1}, max_running={"j-a": 2})
    assert sorted(out.held_back) == [f"j-a_{i}" for i in range(1, 6)]  # one slot left: the first task
    assert out.held_back["j-a_3"] == "waiting: array j-a runs 2 of at most 2 at once"
    assert not out.doomed
    assert gate(queue, {}, running={"j-a": 2}, max_running={"j-a": 2}).held_back.keys() == {q.id for q in queue}
    assert gate(queue, {}, running={}, max_running={}).held_back == {}  # no cap: every task is planned


def test_a_dependent_waits_then_is_planned() -> None:
    b = Queued("j-b", depends_on=(("j-a", "succeeded"),))
    assert gate([b], {"j-a": js.RUNNING}, {}, {}).held_back == {"j-b": "waiting: waits for j-a to succeed"}
    assert gate([b], {"j-a": js.SUCCEEDED}, {}, {}).held_back == {}
    f = Queued("j-f", depends_on=(("j-a", "finished"),))
    assert gate([f], {"j-a": js.PENDING}, {}, {}).held_back == {"j-f": "waiting: waits for j-a to finish"}


def test_a_dependency_that_can_no_longer_hold_fails_the_chain_at_once() -> None:
    queue = [Queued("j-c", depends_on=(("j-a", "succeeded"),)), Queued("j-d", depends_on=(("j-c", "finished"),)),
             Queued("j-e", depends_on=(("j-a", "failed"),))]
    out = gate(queue, {"j-a": js.FAILED}, {}, {})
    assert out.doomed == {"j-c": "dependency j-a failed; it can no longer succeed"}
    assert out.held_back == {}  # j-d (afterany) runs: j-c ends, failing, in this very cycle
    assert "j-e" not in out.held_back and "j-e" not in out.doomed  # afternotok: it runs
    chain = [Queued("j-c", depends_on=(("j-a", "succeeded"),)), Queued("j-d", depends_on=(("j-c", "succeeded"),))]
    assert set(gate(chain, {"j-a": js.CANCELLED}, {}, {}).doomed) == {"j-c", "j-d"}
    assert gate([Queued("j-x", depends_on=(("j-a", "failed"),))], {"j-a": js.SUCCEEDED}, {}, {}).doomed == {
        "j-x": "dependency j-a succeeded; it can no longer fail"}


def test_tasks_waiting_for_a_parent_take_no_slot_of_their_array() -> None:
    queue = [task("j-a", 0, ("j-p", "succeeded")), task("j-a", 1), task("j-a", 2)]
    out = gate(queue, {"j-p": js.RUNNING}, {}, {"j-a": 1})
    assert out.held_back == {"j-a_0": "waiting: waits for j-p to succeed",
                             "j-a_2": "waiting: array j-a runs 1 of at most 1 at once"}
