"""A re-plan read per rank, and a re-plan that keeps every device at its pipeline position."""

from __future__ import annotations

from rota.bench.detector_real_bench import replan_for
from rota.core.detection.layout import Layout
from rota.core.detection.replan import replan


def test_the_free_order_plan_moves_the_slow_device_so_its_stage_index_is_not_its_rank() -> None:
    plan = replan(Layout(1, 4, 1), [1.0, 1 / 1.41, 1.0, 1.0], layers=16, microbatches=4)
    assert plan.stages[0].ranks == (1,)  # the slow device went first, where the bubbles hide it
    assert plan.layers_of_rank(1) == 3 and plan.layers_per_stage[1] == 5  # reading per position gives it 5


def test_the_real_jobs_replan_takes_layers_off_the_slow_rank_not_onto_it() -> None:
    # The real job's first re-plan (ratio 1.41 on rank 1) was applied as 3,5,4,4 per rank:
    # the throttled rank got a fifth layer. Per rank it must get fewer than every other.
    plan = replan_for(1, 1.41, 16)
    per_rank = [plan.layers_of_rank(r) for r in range(4)]
    assert sum(per_rank) == 16
    assert per_rank[1] < min(per_rank[0], per_rank[2], per_rank[3])
    assert per_rank == plan.layers_per_stage  # positions kept: per rank is per stage
    assert plan.throughput_before < plan.throughput_after < 1.0


def test_keep_order_leaves_every_group_at_its_position() -> None:
    speeds = [1.0] * 8
    speeds[5] = 1 / 1.5  # stage 2's TP group (4, 5)
    plan = replan(Layout(2, 4, 1), speeds, layers=16, microbatches=8, keep_order=True)
    assert [st.ranks for st in plan.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert plan.stages[2].layers < min(st.layers for st in plan.stages if st.stage != 2)
    free = replan(Layout(2, 4, 1), speeds, layers=16, microbatches=8)
    assert plan.throughput_after <= free.throughput_after + 1e-9  # the free order searches a superset


def test_keep_order_puts_regrouped_devices_at_the_affected_positions() -> None:
    speeds = [1.0] * 8
    speeds[1] = speeds[6] = 1 / 1.5  # one slow device in stage 0's group and one in stage 3's
    plan = replan(Layout(2, 4, 1), speeds, layers=16, microbatches=8, keep_order=True)
    groups = [st.ranks for st in plan.stages]
    assert groups[1:3] == [(2, 3), (4, 5)]  # untouched groups stay put
    assert sorted(groups[0] + groups[3]) == [0, 1, 6, 7] and (1, 6) in (groups[0], groups[3])  # slow ones paired
