"""Job limits (`cpus`, `memory`, `time_limit`): quantities, the job file, the wire, and the
server's validation, each bad value an error naming the field (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from rota.client._wire import spec_from_proto, spec_to_proto
from rota.client.errors import InvalidArgumentError
from rota.client.jobfile import job_spec_from_mapping
from rota.common.convert import spec_from_proto as server_spec
from rota.common.convert import spec_to_proto as server_proto
from rota.core import quantities
from rota.core.errors import InvalidArgument
from rota.core.jobspec import JobSpecData, memory_bytes, validate


@pytest.mark.parametrize(("text", "expected"), [
    ("256Mi", 256 * 2**20), ("4Gi", 4 * 2**30), ("1.5Gi", 3 * 2**29), ("1G", 10**9), ("500M", 5 * 10**8),
    ("128974848", 128974848), (1073741824, 2**30), ("1e3", 1000), ("64Ki", 65536), ("2k", 2000), (" 1Ti ", 2**40),
])
def test_memory_quantities(text: Any, expected: int) -> None:
    assert quantities.parse_memory(text) == expected
    assert quantities.memory_problem(text) is None


@pytest.mark.parametrize(("text", "reason"), [
    ("-1Gi", "must be positive"), ("0", "must be positive"), ("4GB", "unknown suffix 'GB'"), ("4gi", "unknown suffix"),
    ("lots", "cannot read"), ("", "cannot read"), (True, "must be a quantity"), (None, "must be a quantity"),
    ("2Ei", "more than 1 EiB"), ("0.1", "less than one byte"), (float("nan"), "must be positive"),
])
def test_bad_memory_quantities_say_why(text: Any, reason: str) -> None:
    problem = quantities.memory_problem(text)
    assert problem is not None and reason in problem
    with pytest.raises(ValueError, match=reason.split("'")[0]):
        quantities.parse_memory(text)


@pytest.mark.parametrize(("n", "text"), [
    (4 * 2**30, "4 GiB"), (256 * 2**20, "256 MiB"), (3 * 2**29, "1.5 GiB"), (100, "100 B"), (2**40, "1 TiB"), (1536, "1.5 KiB"),
])
def test_bytes_read_as_a_person_reads_them(n: int, text: str) -> None:
    assert quantities.format_bytes(n) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (600, "0:10:00"), (5, "0:00:05"), (3661, "1:01:01"), (86400 + 7200, "1 day, 2:00:00"), (2 * 86400, "2 days, 0:00:00"),
])
def test_time_limits_read_as_timedelta(seconds: float, text: str) -> None:
    assert quantities.format_limit(seconds) == text
    if seconds < 86400:
        assert text == str(timedelta(seconds=seconds))


def spec(**overrides: Any) -> JobSpecData:
    base = JobSpecData(name="j", tenant="t", kind="training", priority=5, gpus=1, command=["python", "x.py"])
    return replace(base, **overrides)


def test_limits_are_optional_and_kept() -> None:
    assert validate(spec(), max_gpus_per_node=8).memory == ""
    checked = validate(spec(cpus=2.0, memory="4Gi", time_limit_seconds=600.0), max_gpus_per_node=8)
    assert (checked.cpus, checked.memory, checked.time_limit_seconds) == (2.0, "4Gi", 600.0)
    assert memory_bytes(checked) == 4 * 2**30 and memory_bytes(spec()) == 0


@pytest.mark.parametrize(("overrides", "field", "reason"), [
    ({"cpus": 0.0}, "cpus", "must be positive"),
    ({"cpus": -1.0}, "cpus", "must be positive"),
    ({"cpus": float("inf")}, "cpus", "must be positive"),
    ({"cpus": 5000.0}, "cpus", "more than 4096"),
    ({"memory": "-4Gi"}, "memory", "must be positive"),
    ({"memory": "4GB"}, "memory", "unknown suffix"),
    ({"memory": "four"}, "memory", "cannot read"),
    ({"time_limit_seconds": 0.0}, "time_limit", "at least one second"),
    ({"time_limit_seconds": -60.0}, "time_limit", "at least one second"),
    ({"time_limit_seconds": 400 * 86400.0}, "time_limit", "more than 365 days"),
])
def test_bad_limits_name_the_field(overrides: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate(spec(**overrides), max_gpus_per_node=8)
    assert caught.value.field == field and reason in caught.value.reason


def test_job_file_fields_reach_the_server_intact() -> None:
    sdk = job_spec_from_mapping({"command": "python x.py", "cpus": 2, "memory": "4Gi", "time_limit": "10m"})
    assert (sdk.cpus, sdk.memory, sdk.time_limit) == (2.0, "4Gi", timedelta(minutes=10))
    message = spec_to_proto(sdk)
    assert message.HasField("cpus") and message.cpus == 2.0 and message.memory == "4Gi"
    assert message.time_limit_seconds == 600.0
    data = server_spec(message)
    assert (data.cpus, data.memory, data.time_limit_seconds) == (2.0, "4Gi", 600.0)
    back = spec_from_proto(server_proto(data))  # a job's spec as `rota job` shows it
    assert (back.cpus, back.memory, back.time_limit) == (2.0, "4Gi", timedelta(minutes=10))


def test_absent_limits_stay_absent_on_the_wire() -> None:
    message = spec_to_proto(job_spec_from_mapping({"command": "python x.py"}))
    assert not message.HasField("cpus") and not message.HasField("time_limit_seconds") and message.memory == ""
    data = server_spec(message)
    assert (data.cpus, data.memory, data.time_limit_seconds) == (None, "", None)
    back = spec_from_proto(server_proto(data))
    assert (back.cpus, back.memory, back.time_limit) == (None, None, None)


@pytest.mark.parametrize(("data", "field"), [({"cpus": 0}, "cpus"), ({"memory": "-1Gi"}, "memory"), ({"memory": "4GB"}, "memory")])
def test_bad_values_reach_the_server_to_be_refused(data: dict[str, Any], field: str) -> None:
    """0 CPUs is sent (not dropped as "unset") and a quantity as written, so the server names
    the field rather than ignoring it."""
    message = spec_to_proto(job_spec_from_mapping({"command": "python x.py", **data}))
    with pytest.raises(InvalidArgument) as caught:
        validate(replace(server_spec(message), name="j", tenant="t", kind="training", priority=5), max_gpus_per_node=8)
    assert caught.value.field == field


@pytest.mark.parametrize(("data", "field"), [
    ({"memory": [4]}, "memory"), ({"memory": 4.5}, "memory"),
    ({"cpus": "two"}, "cpus"), ({"cpus": True}, "cpus"), ({"time_limit": "soon"}, "time_limit"),
    ({"time_limit": -5}, "time_limit"),
])
def test_bad_job_file_limits_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        job_spec_from_mapping({"command": "python x.py", **data})
    assert caught.value.field == field
