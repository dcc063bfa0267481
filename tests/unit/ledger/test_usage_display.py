"""How `rota usage` prints GPU-hours, and what the SDK makes of an older ledger's answers."""

from __future__ import annotations

import pytest

from rota.cli.ledger_commands import _hours
from rota.client.ledger import JobFairness, TenantFairness, UsageEntry
from rota.v1 import common_pb2, ledger_pb2


@pytest.mark.parametrize(
    ("hours", "shown"),
    [
        pytest.param(0.0, "0.00", id="nothing"),
        pytest.param(1 / 3600, "0.0002778", id="one GPU-second"),
        pytest.param(1 / 60, "0.01667", id="one GPU-minute"),
        pytest.param(0.5, "0.5000", id="half an hour"),
        pytest.param(8.0, "8.000", id="a few hours"),
        pytest.param(12.6796, "12.68", id="tens"),
        pytest.param(1234.5678, "1234.57", id="thousands keep two decimals"),
        pytest.param(1e-12, "0.000000000", id="below the last decimal shown"),
    ],
)
def test_gpu_hours_show_four_significant_digits_and_at_least_two_decimals(hours: float, shown: str) -> None:
    assert _hours(hours) == shown


def test_weighted_figures_from_a_ledger_without_rates_are_its_raw_ones() -> None:
    old = UsageEntry._from_proto(ledger_pb2.UsageRow(key="nlp", gpu_hours=2.0, tenant="nlp"))
    assert old.weighted_gpu_hours == 2.0
    new = UsageEntry._from_proto(ledger_pb2.UsageRow(key="nlp", gpu_hours=2.0, tenant="nlp", weighted_gpu_hours=6.3))
    assert new.to_dict() == {"key": "nlp", "gpu_hours": 2.0, "tenant": "nlp", "weighted_gpu_hours": 6.3}
    assert UsageEntry._from_proto(ledger_pb2.UsageRow(key="idle")).weighted_gpu_hours == 0.0
    tenant = TenantFairness._from_proto(ledger_pb2.TenantStanding(tenant="nlp", used=3.0, deserved=3.0))
    assert tenant.raw_used == 3.0  # an old ledger's `used` was raw
    job = JobFairness._from_proto(ledger_pb2.JobFairness(job_id="j", used=6.0, raw_used=2.0,
                                                       job_state=common_pb2.JOB_STATE_RUNNING))
    assert (job.used, job.raw_used) == (6.0, 2.0)
