"""GPU-type rates (rota.core.fairness.rates), ROTA_GPU_TYPE_RATES, and weighted standings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from rota.common.config import Settings
from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.rates import (
    DEFAULT_RATES,
    PEAK_TENSOR_TFLOPS,
    UNKNOWN_RATE,
    GpuRates,
    parse_rates,
    rates_from_text,
)
from rota.core.fairness.standings import Span, tenant_standing, used_in_window
from rota.ledger.collector import hour_index, lease_records
from rota.ledger.repository import LeaseSource

H = 3600.0


def test_the_defaults_are_peak_tensor_throughput_over_an_a100s() -> None:
    assert DEFAULT_RATES.rate("a100") == Decimal(1)
    assert DEFAULT_RATES.rate("h100") == Decimal("3.1699")  # 989 / 312
    assert DEFAULT_RATES.rate("h200") == DEFAULT_RATES.rate("h100")
    assert DEFAULT_RATES.rate("v100") == Decimal("0.4006")  # 125 / 312
    assert DEFAULT_RATES.rate("b200") == Decimal("7.2115")
    assert set(DEFAULT_RATES.table) == set(PEAK_TENSOR_TFLOPS)
    order = sorted(PEAK_TENSOR_TFLOPS, key=PEAK_TENSOR_TFLOPS.__getitem__)
    assert [DEFAULT_RATES.rate(t) for t in order] == sorted(DEFAULT_RATES.table.values())


@pytest.mark.parametrize("gpu_type", ["", "rtx4090", "mi300x"])
def test_an_unknown_type_counts_as_one(gpu_type: str) -> None:
    assert DEFAULT_RATES.rate(gpu_type) == UNKNOWN_RATE == Decimal(1)


def test_overrides_replace_and_add_types_and_keep_the_rest() -> None:
    rates = rates_from_text("h100=3.2, A100=1 ,mi300x=2.5,")
    assert rates.rate("h100") == Decimal("3.2")
    assert rates.rate("a100") == Decimal(1)
    assert rates.rate("mi300x") == Decimal("2.5")
    assert rates.rate("v100") == DEFAULT_RATES.rate("v100")
    assert DEFAULT_RATES.rate("h100") == Decimal("3.1699")  # the defaults are not changed
    assert rates_from_text("") == DEFAULT_RATES
    assert rates.rates(["h100", "", "v100"]) == (Decimal("3.2"), Decimal(1), Decimal("0.4006"))


def test_the_table_is_a_copy_the_caller_cannot_change_later() -> None:
    table = {"h100": Decimal(3)}
    rates = GpuRates(table)
    table["h100"] = Decimal(9)
    assert rates.rate("h100") == Decimal(3)
    with pytest.raises(TypeError):
        rates.table["h100"] = Decimal(9)  # type: ignore[index]


def test_describe_reads_back_as_the_same_rates() -> None:
    assert GpuRates(parse_rates(DEFAULT_RATES.describe())) == DEFAULT_RATES


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("h100", "TYPE=RATE", id="no equals sign"),
        pytest.param("h100=fast", "not a number", id="not a number"),
        pytest.param("h100=0", "positive", id="zero"),
        pytest.param("h100=-1", "positive", id="negative"),
        pytest.param("h100=inf", "positive", id="infinite"),
        pytest.param("h100=nan", "positive", id="nan"),
        pytest.param("=2", "empty", id="no type"),
        pytest.param("h 100=2", "lowercase letters", id="a bad type"),
        pytest.param("h100=2,h100=3", "twice", id="a type twice"),
    ],
)
def test_a_bad_item_is_refused_naming_it(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_rates(text)


def test_settings_read_rates_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTA_GPU_TYPE_RATES", raising=False)
    assert Settings.from_env().gpu_type_rates == DEFAULT_RATES == Settings().gpu_type_rates
    monkeypatch.setenv("ROTA_GPU_TYPE_RATES", "h100=3.2,a100=1")
    assert Settings.from_env().gpu_type_rates.rate("h100") == Decimal("3.2")


def test_a_bad_rate_variable_stops_the_settings_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROTA_GPU_TYPE_RATES", "h100=lots")
    with pytest.raises(ValueError, match=r"^ROTA_GPU_TYPE_RATES: h100: rate 'lots' is not a number"):
        Settings.from_env()


def test_a_lease_row_carries_its_gpus_types_and_rates() -> None:
    t0 = datetime(2026, 3, 1, 10, 40, tzinfo=UTC)
    p = LeaseSource(7, "j-1", "nlp", "n1", [0, 1], t0, None, ("h100", ""))
    rows = lease_records(p, t0 + timedelta(minutes=30), rates_from_text("h100=3"))
    assert [(r.sequence, r.gpu_types, r.gpu_rates) for r in rows] == [
        (hour_index(t0), ("h100", ""), (Decimal(3), Decimal(1))),
        (hour_index(t0) + 1, ("h100", ""), (Decimal(3), Decimal(1))),
    ]
    assert rows[0].values()["weighted_gpus"] == Decimal(4)
    # A lease of unknown types (the collector found none) counts one per GPU.
    plain = lease_records(LeaseSource(8, "j-2", "nlp", "n1", [3], t0, None), t0 + timedelta(minutes=5))
    assert plain[0].values()["weighted_gpus"] == Decimal(1) and plain[0].gpu_types == ("",)


def test_weighted_spans_make_weighted_use_and_the_raw_sum_matches_the_account() -> None:
    now = 100 * H + 1800
    cfg = FairnessConfig()
    raw = [Span(95 * H, 97 * H, 4), Span(99 * H, now, 2)]
    weighted = [Span(95 * H, 97 * H, 4 * 3.1699), Span(99 * H, now, 2 * 0.4006)]
    demand = [Span(95 * H, now, 4)]
    plain = tenant_standing("a", 4, 0.0, now, demand, raw, cfg)
    rated = tenant_standing("a", 4, 0.0, now, demand, weighted, cfg)
    assert plain.used == pytest.approx(4 * 2 * H + 2 * 1.5 * H)
    assert rated.used == pytest.approx(4 * 3.1699 * 2 * H + 2 * 0.4006 * 1.5 * H)
    # Only U is rated: what a tenant was entitled to and deserved is GPUs, whatever it ran on.
    assert (rated.entitled, rated.deserved) == (plain.entitled, plain.deserved)
    assert used_in_window(0.0, now, raw, cfg) == pytest.approx(plain.used)
    assert used_in_window(0.0, now, weighted, cfg) == pytest.approx(rated.used)
    assert used_in_window(96 * H, now, raw, cfg) == pytest.approx(plain.used - 4 * H)  # a younger tenant
