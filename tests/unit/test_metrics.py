"""The metrics' pure pieces: bounded labels, the GPUs a plan holds back, a scrape-time
collector that caches and survives a failed read, and the RPC counter's status codes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rota.allocator.metrics import held_back, step_trigger, trigger_kind
from rota.common import metrics
from rota.common.metrics import CachedCollector, gauge, split_method
from rota.core.planning.liveplan import Layout, LiveNode, LiveScenario, StepDecision
from rota.core.planning.scenario import Scenario


@pytest.mark.parametrize(("trigger", "kind"), [
    ("full re-plan (timer)", "timer"),
    ("first plan of this leader", "leader"),
    (step_trigger(12, 30.0), "step"),
    ("j-1234 arrived; node-2 left", "change"),
])
def test_a_trigger_is_labelled_by_its_kind_never_by_the_jobs_it_names(trigger: str, kind: str) -> None:
    assert trigger_kind(trigger) == kind


def test_a_new_steps_trigger_says_when_it_began_in_utc_not_its_absolute_number() -> None:
    # Step 59874907 of 30 s began 1796247210 s after the epoch: 2026-12-02 21:33:30 UTC.
    text = step_trigger(59874907, 30.0)
    assert text == "step began at 21:33:30 UTC" and "59874907" not in text
    assert step_trigger(499, 3600.0) == "step began at 19:00:00 UTC"  # an hour's step: on the hour


@pytest.mark.parametrize(("method", "parts"), [
    ("/rota.v1.JobService/SubmitJob", ("rota.v1.JobService", "SubmitJob")),
    ("/grpc.health.v1.Health/Check", ("grpc.health.v1.Health", "Check")),
    ("odd", ("odd", "unknown")),
])
def test_split_method(method: str, parts: tuple[str, str]) -> None:
    assert split_method(method) == parts


def _live(nodes: list[LiveNode]) -> LiveScenario:
    scenario = Scenario(name="t", gpus=4, horizon=3, step_seconds=60, batch=(), realtime=(), order=())
    return LiveScenario(scenario, Layout(2, tuple(nodes)), {})


@pytest.mark.parametrize(("grid", "planned", "want"), [
    # GPU rows x steps. Row 1 is free now and given to the waiting "w" at step 1: held back.
    ([["a", "a", None], [None, "w", "w"], [None, None, None], [None, None, None]], {"w": 1}, {"n1": 1, "n2": 0}),
    # Free now and later filled by a job that is not waiting (it runs already): not held back.
    ([["a", "a", None], [None, "a", None], [None, None, None], [None, None, None]], {}, {"n1": 0, "n2": 0}),
    # A reserved row (a bad GPU) is never counted; both rows of n2 kept for the gang "g".
    ([["~bad-n1-0", "~bad-n1-0", "~bad-n1-0"], [None, None, None], [None, "g", "g"], [None, "g", "g"]], {"g": 1},
     {"n1": 0, "n2": 2}),
])
def test_held_back_counts_free_gpus_kept_for_a_waiting_job(
    grid: list[list[str | None]], planned: dict[str, int], want: dict[str, int],
) -> None:
    live = _live([LiveNode("n1", 2), LiveNode("n2", 2)])
    assert held_back(live, grid, StepDecision(planned_start=planned)) == want


def test_a_cached_collector_reads_once_per_ttl_and_a_failed_read_yields_nothing() -> None:
    calls: list[int] = []

    def read() -> list:  # type: ignore[type-arg]
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("database down")
        return [gauge("rota_test_value", "a test gauge", ["x"], [(("a",), float(len(calls)))])]

    registry = CollectorRegistry()
    collector = CachedCollector(read, ttl_s=3600)
    registry.register(collector)
    first = generate_latest(registry).decode()
    assert 'rota_test_value{x="a"} 1.0' in first
    assert generate_latest(registry).decode() == first and len(calls) == 1  # cached
    collector._ttl_s = 0  # expire at once: the next read fails
    errors_before = metrics.POSTGRES_ERRORS.labels(kind="ConnectionError")._value.get()
    failed = generate_latest(registry).decode()
    assert "rota_test_value" not in failed
    assert metrics.POSTGRES_ERRORS.labels(kind="ConnectionError")._value.get() == errors_before + 1
    assert 'rota_test_value{x="a"} 3.0' in generate_latest(registry).decode()  # back once the store is


def test_every_rota_counter_and_histogram_follows_the_naming_conventions() -> None:
    families = list(text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode()))
    rota = [f for f in families if f.name.startswith("rota_")]
    assert rota
    for family in rota:
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_bytes")), family.name
        assert "job_id" not in {label for s in family.samples for label in s.labels}, family.name
    counters = [f for f in rota if f.type == "counter"]
    assert counters and all(not f.name.endswith("_total") for f in counters)  # the client adds _total
    text = generate_latest(metrics.REGISTRY).decode()
    assert "_created" not in text


@pytest.mark.parametrize(("progress", "expected"), [
    ({"step": 3, "loss": 2.5, "window": 12}, [("step", 3.0), ("loss", 2.5), ("window", 12.0)]),
    ({"done": True, "phase": "warmup", "nested": {"a": 1}, "nan": float("nan")}, []),  # not numbers
    ("not a mapping", []),
    ({f"k{i}": i for i in range(40)}, [(f"k{i}", float(i)) for i in range(16)]),  # bounded per job
])
def test_a_job_s_progress_exports_its_numeric_values_only_and_a_bounded_number(
    progress: object, expected: list[tuple[str, float]],
) -> None:
    from rota.api.metrics import MAX_PROGRESS_KEYS, numeric_progress

    assert numeric_progress(progress) == expected
    assert len(numeric_progress({str(i): i for i in range(100)})) == MAX_PROGRESS_KEYS


def test_progress_keys_are_cut_to_a_bounded_label_and_a_cut_that_repeats_keeps_the_first() -> None:
    from rota.api.metrics import MAX_PROGRESS_KEY_CHARS, numeric_progress

    long_a, long_b = "a" * 500 + "x", "a" * 500 + "y"
    found = numeric_progress({long_a: 1, long_b: 2, "loss": 0.5})
    assert found == [("a" * MAX_PROGRESS_KEY_CHARS, 1.0), ("loss", 0.5)]


def test_rota_job_progress_has_a_hard_cap_on_series_and_counts_what_it_leaves_out() -> None:
    from rota.api.metrics import MAX_PROGRESS_KEYS, progress_series

    running = [(f"j-{i:010d}", "t", "TRAINING", {f"k{k}": k for k in range(20)}) for i in range(10)]
    bounded = progress_series(running, max_series=50)
    assert len(bounded.series) == 50
    assert bounded.dropped == {"keys": 10 * (20 - MAX_PROGRESS_KEYS), "series": 10 * MAX_PROGRESS_KEYS - 50}
    # The first jobs in id order keep all their keys: the same ones from one read to the next.
    assert {s[0][0] for s in bounded.series} == {f"j-{i:010d}" for i in range(4)}
    assert all(len(labels[3]) <= 64 for labels, _ in bounded.series)

