"""Quota rules (rota.core.fairness.quotas), table-driven: validation, admission, reclaim."""

from __future__ import annotations

import pytest

from rota.core.fairness.quotas import (
    Asking,
    Holding,
    Quota,
    QuotaError,
    admit,
    check_quota,
    reclaims,
    standing,
)

Q = {
    "vision": Quota("vision", guaranteed=4, limit=8),
    "nlp": Quota("nlp", guaranteed=4, limit=8),
    "free": Quota("free"),
}


@pytest.mark.parametrize(("quota", "others", "field", "words"), [
    (Quota("a", guaranteed=-1), {}, "guaranteed", "negative"),
    (Quota("a", limit=-2), {}, "limit", "negative"),
    (Quota("a", guaranteed=8, limit=4), {}, "limit", "below the guarantee"),
    (Quota("a", type_limits=(("a100", -1),)), {}, "gpu_limits[a100]", "between"),
    (Quota("a", parent="a"), {}, "parent", "own parent"),
    (Quota("a", parent="zz"), {}, "parent", "no tenant"),
    (Quota("a", parent="b"), {"b": Quota("b", parent="a")}, "parent", "cycle"),
    (Quota("a", parent="b"), {"b": Quota("b", parent="c"), "c": Quota("c", parent="a")}, "parent", "a -> b -> c -> a"),
    (Quota("a", guaranteed=6, parent="d"), {"d": Quota("d", guaranteed=8), "x": Quota("x", guaranteed=4, parent="d")},
     "guaranteed", "more than its own guarantee 8"),
    (Quota("a", guaranteed=6, parent="d"), {"d": Quota("d", limit=4)}, "guaranteed", "above its parent"),
])
def test_bad_quotas_name_the_field(quota: Quota, others: dict[str, Quota], field: str, words: str) -> None:
    with pytest.raises(QuotaError) as caught:
        check_quota(quota, others)
    assert caught.value.field == field
    assert words in caught.value.reason


@pytest.mark.parametrize("quota", [
    Quota("a"), Quota("a", guaranteed=4, limit=4), Quota("a", limit=0),
    Quota("a", guaranteed=2, parent="d"), Quota("a", type_limits=(("h100", 2),)),
])
def test_good_quotas_pass(quota: Quota) -> None:
    check_quota(quota, {"d": Quota("d", guaranteed=4, limit=16)})


def run(job: str, tenant: str, gpus: int, **kw: object) -> Holding:
    return Holding(job, tenant, gpus, **kw)  # type: ignore[arg-type]


def ask(job: str, tenant: str, gpus: int, preemptible: bool = True, types: frozenset[str] = frozenset()) -> Asking:
    return Asking(job, tenant, gpus, types, preemptible)


@pytest.mark.parametrize(("running", "waiting", "held"), [
    # Under the limit: admitted; the next one counts the first as started.
    ([run("r", "vision", 4)], [ask("a", "vision", 4), ask("b", "vision", 2)], {"b": "at its limit 8"}),
    # Exactly at the limit: held, with the pinned words.
    ([run("r", "vision", 8)], [ask("a", "vision", 1)], {"a": "waits: tenant vision at its limit 8"}),
    # A later, smaller job may still fit where a larger one did not.
    ([run("r", "vision", 6)], [ask("a", "vision", 4), ask("b", "vision", 2)], {"a": "at its limit 8"}),
    # A non-preemptible job does not borrow; within the guarantee it is admitted.
    ([run("r", "nlp", 2)], [ask("a", "nlp", 4, preemptible=False), ask("b", "nlp", 2, preemptible=False)],
     {"a": "only preemptible jobs borrow"}),
    # A tenant without a quota is never held.
    ([run("r", "free", 64)], [ask("a", "free", 64, preemptible=False)], {}),
])
def test_admission(running: list[Holding], waiting: list[Asking], held: dict[str, str]) -> None:
    got = admit(Q, running, waiting)
    assert set(got.held) == set(held)
    for job, words in held.items():
        assert words in got.held[job]


def test_parent_limit_caps_the_subtree() -> None:
    tree = {"dept": Quota("dept", limit=8), "g1": Quota("g1", parent="dept"), "g2": Quota("g2", parent="dept")}
    got = admit(tree, [run("r", "g1", 6)], [ask("a", "g2", 2), ask("b", "g2", 1)])
    assert list(got.held) == ["b"]
    assert "tenant g2's parent dept at its limit 8" in got.held["b"]


def test_type_limits_narrow_then_hold() -> None:
    quotas = {"v": Quota("v", type_limits=(("h100", 2),))}
    got = admit(quotas, [run("r", "v", 2, gpu_type="h100")], [ask("a", "v", 1), ask("b", "v", 1, types=frozenset({"h100"}))],
                cluster_types={"a100", "h100"})
    assert got.narrowed == {"a": frozenset({"a100"})}
    assert "limit 2 of h100" in got.held["b"]


@pytest.mark.parametrize(("running", "waiting", "free", "victims"), [
    # The owner returns within its guarantee: the borrower's job is reclaimed.
    ([run("v1", "vision", 4, node="x", movable=True, cost_s=9.0), run("v2", "vision", 4, node="y", movable=True)],
     [ask("w", "nlp", 4)], {"x": 0, "y": 0}, {"v2"}),
    # Beyond its guarantee it waits like anyone else: nothing reclaimed.
    ([run("n1", "nlp", 4, node="x", movable=True), run("v2", "vision", 4, node="y", movable=True)],
     [ask("w", "nlp", 2)], {"x": 0, "y": 0}, set()),
    # Free room already: nothing to reclaim.
    ([run("v2", "vision", 8, node="y", movable=True)], [ask("w", "nlp", 2)], {"x": 2}, set()),
    # Borrowers that cannot move are not reclaimed.
    ([run("v2", "vision", 8, node="y")], [ask("w", "nlp", 4)], {"y": 0}, set()),
    # The cheaper of two equal borrowers goes.
    ([run("v1", "vision", 2, node="y", movable=True, cost_s=50.0), run("v2", "vision", 2, node="y", movable=True,
      cost_s=5.0), run("v3", "vision", 4, node="y", movable=True, cost_s=10.0)], [ask("w", "nlp", 2)], {"y": 0}, {"v2"}),
    # A job over what its tenant borrows goes last: the owner's own within-guarantee jobs stay.
    ([run("v1", "vision", 4, node="y", movable=True), run("v2", "vision", 2, node="y", movable=True)],
     [ask("w", "nlp", 2)], {"y": 0}, {"v2"}),
    # Victims on different nodes do not make one node's room.
    ([run("v1", "vision", 2, node="a", movable=True), run("v2", "vision", 2, node="b", movable=True),
      run("v3", "vision", 4, node="c", movable=True), run("v4", "vision", 4, node="d", movable=True)],
     [ask("w", "nlp", 4)], {"a": 0, "b": 0, "c": 0, "d": 0}, {"v3"}),
])
def test_reclaim(running: list[Holding], waiting: list[Asking], free: dict[str, int], victims: set[str]) -> None:
    got = reclaims(Q, running, waiting, free)
    assert {r.job_id for r in got} == victims
    for r in got:
        assert r.for_tenant == "nlp" and "reclaims" in r.reason


def test_standing_counts_borrowed() -> None:
    got = standing(Q, [run("a", "vision", 6), run("b", "nlp", 2)])
    assert got["vision"] == (6, 2) and got["nlp"] == (2, 0) and got["free"] == (0, 0)
