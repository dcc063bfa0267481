"""Rank numbering, the wire form of micro-batches, and the 1F1B critical path (hand-computed)."""

from __future__ import annotations

import pytest

from rota.core.detection.costmodel import features, fit
from rota.core.detection.layout import IterationReport, Layout, flatten, unflatten
from rota.core.detection.pipeline import makespan, schedule
from rota.core.errors import InvalidArgument


@pytest.mark.parametrize(("rank", "tp_index", "stage", "replica"), [
    (0, 0, 0, 0), (1, 1, 0, 0), (2, 0, 1, 0), (5, 1, 2, 0), (7, 1, 3, 0), (8, 0, 0, 1), (9, 1, 0, 1), (15, 1, 3, 1),
])
def test_ranks_count_tensor_parallel_fastest_then_pipeline_then_data(rank: int, tp_index: int, stage: int, replica: int) -> None:
    layout = Layout(tp=2, pp=4, dp=2)
    assert (layout.tp_index(rank), layout.stage(rank), layout.replica(rank)) == (tp_index, stage, replica)
    assert layout.rank(tp_index, stage, replica) == rank


def test_a_stage_map_in_the_report_overrides_the_numbering_but_not_the_replica() -> None:
    layout = Layout(tp=1, pp=2, dp=2, stages=(1, 0, 0, 1))
    assert [layout.stage(r) for r in range(4)] == [1, 0, 0, 1]
    assert layout.group(0, 1) == [2] and layout.group(1, 1) == [3]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tp": 0, "pp": 1, "dp": 1}, "layout.tp"),
    ({"tp": 1, "pp": 2, "dp": 1, "stages": (0,)}, "layout.stages"),
    ({"tp": 1, "pp": 2, "dp": 1, "stages": (0, 2)}, "layout.stages"),
])
def test_a_bad_layout_names_its_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        Layout(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize(("seconds", "micro", "field"), [
    ((1.0,), (((8,),),), "rank_seconds"),
    ((1.0, -2.0), (((8,),),), "rank_seconds"),
    ((1.0, float("nan")), (((8,),),), "rank_seconds"),
    ((1.0, 1.0), (), "micro_batches"),
    ((1.0, 1.0), (((0,),),), "micro_batches"),
])
def test_a_bad_report_names_its_field(seconds: tuple[float, ...], micro: tuple, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument) as err:
        IterationReport(0, Layout(1, 2, 1), seconds, micro)
    assert err.value.field == field


def test_micro_batches_survive_the_flat_wire_form() -> None:
    micro = (((100, 200), (300,)), ((4,), (5, 6, 7)))
    lengths, counts, per_replica = flatten(micro)
    assert (lengths, counts, per_replica) == ([100, 200, 300, 4, 5, 6, 7], [2, 1, 1, 3], 2)
    assert unflatten(lengths, counts, dp=2) == micro
    with pytest.raises(InvalidArgument):
        unflatten(lengths, [2, 1, 1], dp=2)


def test_one_f_one_b_warms_up_with_p_minus_s_minus_1_forwards() -> None:
    orders = schedule(3, 2)
    assert orders[0] == (("F", 0), ("F", 1), ("B", 0), ("W", 0), ("F", 2), ("B", 1), ("W", 1), ("B", 2), ("W", 2))
    assert orders[1][:4] == (("F", 0), ("B", 0), ("W", 0), ("F", 1))


@pytest.mark.parametrize(("cost", "expected"), [
    ([[1.0, 2.0, 3.0]], 6.0),  # one stage: everything in a row
    ([[3.0], [3.0]], 5.0),  # F0 F0' B0' W0' then B0 W0 on stage 0: 1+1+1+1+1
    ([[3.0, 3.0], [3.0, 3.0]], 8.0),  # the second micro-batch's backward waits for stage 1
    ([[3.0, 3.0], [6.0, 6.0]], 13.0),  # a stage twice as slow stretches the chain, not everything
])
def test_the_makespan_is_the_critical_path_of_the_schedule(cost: list[list[float]], expected: float) -> None:
    assert makespan(cost) == pytest.approx(expected)


def test_the_cost_model_recovers_alpha_and_beta_from_varied_micro_batches() -> None:
    a, b = 0.5, 2.0
    shapes = [(4096,) * 4, (16384,), (8192, 8192), (1000, 2000, 13000)]
    samples = [(features(mb), a * features(mb)[0] + b * features(mb)[1]) for mb in shapes * 3]
    f = fit(samples)
    assert (f.alpha, f.beta) == (pytest.approx(a), pytest.approx(b))
