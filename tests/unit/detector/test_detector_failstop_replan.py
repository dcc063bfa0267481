"""Fail-stop from heartbeats, and the 3-D re-plan around slow and dead devices (hand-computed)."""

from __future__ import annotations

import pytest

from rota.core.detection.failstop import HeartbeatMonitor
from rota.core.detection.layout import Layout
from rota.core.detection.replan import balance_layers, regroup, replan
from rota.core.errors import InvalidArgument


def test_a_source_silent_past_three_intervals_is_dead_once() -> None:
    monitor = HeartbeatMonitor(default_interval_s=1.0)
    monitor.beat("a", 10.0)
    monitor.beat("b", 10.0, interval_s=2.0)
    assert monitor.expired(12.9) == []
    assert [s.source for s in monitor.expired(13.5)] == ["a"]  # b's timeout is 3 x 2 s
    assert monitor.expired(14.0) == []  # reported once
    dead_b = monitor.expired(16.5)
    assert [(s.source, s.silent_s, s.timeout_s) for s in dead_b] == [("b", 6.5, 6.0)]


def test_a_stream_that_ends_is_forgotten_not_dead() -> None:
    monitor = HeartbeatMonitor()
    monitor.beat("a", 0.0)
    monitor.end("a")
    assert monitor.expired(100.0) == []


def test_a_dead_source_that_beats_again_lives_and_can_die_again() -> None:
    monitor = HeartbeatMonitor()
    monitor.beat("a", 0.0)
    assert len(monitor.expired(5.0)) == 1
    monitor.beat("a", 4.0)  # not newer than the silence that killed it: still dead
    monitor.beat("a", 6.0)
    assert monitor.expired(7.0) == []
    assert len(monitor.expired(9.5)) == 1


@pytest.mark.parametrize(("speeds", "caps", "layers", "expected"), [
    ([1.0, 1.0, 1.0], [99] * 3, 9, [3, 3, 3]),
    ([2.0, 2.0, 1.0], [99] * 3, 10, [4, 4, 2]),  # layers ∝ speed
    ([2.0, 2.0, 1.0], [3, 99, 99], 10, [3, 5, 2]),  # a memory cap moves layers to the next best stage
    ([1.0, 1.0], [1, 1], 3, None),  # does not fit
])
def test_layers_go_where_they_lengthen_the_slowest_stage_least(
    speeds: list[float], caps: list[int], layers: int, expected: list[int] | None,
) -> None:
    assert balance_layers(speeds, caps, layers) == expected


@pytest.mark.parametrize(("devices", "tp", "pp", "expected"), [
    # Two half-speed devices in different groups: put them together, one slow group instead of two.
    ([(0, 1.0), (1, 0.5), (2, 1.0), (3, 0.5)], 2, 2, [(0, 2), (1, 3)]),
    # A dead device: its group shrinks to TP 1 rather than idling its partner.
    ([(0, 1.0), (1, 0.0), (2, 1.0), (3, 1.0)], 2, 2, [(0, 2), (3,)]),
    # A very slow device is left out when a smaller TP group is faster without it.
    ([(0, 1.0), (1, 1.0), (2, 1.0), (3, 0.1)], 4, 1, [(0, 1)]),
    # Fewer live devices than stages: no pipeline.
    ([(0, 0.0), (1, 1.0)], 1, 2, None),
])
def test_tensor_parallel_groups_are_regrouped_by_speed(
    devices: list[tuple[int, float]], tp: int, pp: int, expected: list[tuple[int, ...]] | None,
) -> None:
    assert regroup(devices, tp, pp) == expected


def test_a_healthy_layout_keeps_its_plan_at_full_throughput() -> None:
    plan = replan(Layout(2, 2, 2), [1.0] * 8, layers=8, microbatches=4)
    assert (plan.throughput_before, plan.throughput_after, plan.throughput_drop_group) == (1.0, 1.0, 1.0)
    assert plan.layers_per_stage == [4, 4, 4, 4] and plan.microbatches == (4, 4) and plan.idle == ()
    assert [st.ranks for st in plan.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_slow_stage_gets_fewer_layers_and_beats_dropping_its_replica() -> None:
    speeds = [1.0] * 8
    speeds[3] = 1 / 1.5  # replica 0, stage 1
    plan = replan(Layout(2, 2, 2), speeds, layers=16, microbatches=8)
    replica0 = plan.layers_per_stage[:2]
    assert replica0[1] < replica0[0] and sum(replica0) == 16
    assert plan.throughput_drop_group < plan.throughput_before < plan.throughput_after < 1.0
    assert sum(plan.microbatches) == 16 and plan.microbatches[0] < plan.microbatches[1]  # ∝ replica throughput


def test_a_dead_device_stalls_the_job_as_is_and_the_replan_keeps_its_peers_busy() -> None:
    speeds = [1.0] * 8
    speeds[1] = 0.0
    plan = replan(Layout(2, 2, 2), speeds, layers=16, microbatches=8)
    assert plan.throughput_before == 0.0
    assert 0.5 <= plan.throughput_drop_group < plan.throughput_after < 1.0
    assert plan.idle == () and (0,) in [st.ranks for st in plan.stages]


@pytest.mark.parametrize(("speeds", "kwargs", "field"), [
    ([1.0] * 3, {}, "device_speeds"),
    ([1.0, -1.0, 1.0, 1.0], {}, "device_speeds"),
    ([1.0] * 4, {"layers": 1}, "layers"),
    ([1.0] * 4, {"microbatches": 0}, "microbatches"),
])
def test_bad_replan_inputs_name_their_field(speeds: list[float], kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        replan(Layout(2, 2, 1), speeds, **kwargs)
    assert err.value.field == field
