"""Forecasts in the SDK: job duration predictions, demand curves, and traffic files.

The api forwards `rota.v1.ForecasterService`, so these calls ride the client's channel.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from rota.client.errors import InvalidArgumentError
from rota.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

TIME_COLUMNS = ("hour", "time", "timestamp", "at", "at_unix")
COUNT_COLUMNS = ("requests", "count")


def stub(channel: grpc.Channel) -> forecaster_pb2_grpc.ForecasterServiceStub:
    return forecaster_pb2_grpc.ForecasterServiceStub(channel)


@dataclass(frozen=True)
class Forecast:
    """A job's predicted duration (seconds) and GPU-hours, with its P10..P90 interval."""

    model: str
    quantile: float
    seconds: float  # at `quantile`
    p10_seconds: float
    p50_seconds: float
    p90_seconds: float
    gpu_hours_p50: float
    gpu_hours_p90: float
    gpu_hours_planned: float  # quantization: whole GPU-hours with the safety margin (else 0)
    prior_seconds: float  # the physical prior alone (0 when there is none)
    observations: int

    @staticmethod
    def _from_proto(reply: forecaster_pb2.PredictJobResponse, quantile: float) -> Forecast:
        return Forecast(
            model=reply.model, quantile=quantile, seconds=reply.duration_seconds, p10_seconds=reply.duration_p10_seconds,
            p50_seconds=reply.duration_p50_seconds, p90_seconds=reply.duration_p90_seconds,
            gpu_hours_p50=reply.gpu_hours_p50, gpu_hours_p90=reply.gpu_hours_p90,
            gpu_hours_planned=reply.gpu_hours_planned, prior_seconds=reply.prior_seconds, observations=reply.observations,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DemandForecast:
    start_unix: int
    gpus: list[int]
    lower: list[float]
    upper: list[float]
    traffic: list[float]
    history_hours: int

    @staticmethod
    def _from_proto(reply: forecaster_pb2.DemandCurveResponse) -> DemandForecast:
        return DemandForecast(reply.start_unix, list(reply.gpus), list(reply.lower), list(reply.upper),
                              list(reply.traffic), reply.history_hours)


@dataclass(frozen=True)
class TrafficSample:
    """Requests an app served in the hour holding `at_unix`."""

    at_unix: int
    requests: float


def predict_request(spec: common_pb2.JobSpec, quantile: float) -> forecaster_pb2.PredictJobRequest:
    return forecaster_pb2.PredictJobRequest(spec=spec, quantile=quantile)


def demand_request(app: str, horizon: int, capacity: float, max_swap: int) -> forecaster_pb2.DemandCurveRequest:
    return forecaster_pb2.DemandCurveRequest(app=app, horizon=horizon, capacity=capacity, max_swap=max_swap)


def traffic_requests(app: str, samples: Sequence[TrafficSample]) -> list[forecaster_pb2.ObserveRequest]:
    """One idempotent observation per sample: the key is app and time, so re-pushing changes nothing."""
    return [forecaster_pb2.ObserveRequest(key=f"traffic:{app}:{s.at_unix}", app=app, requests=s.requests, at_unix=s.at_unix)
            for s in samples]


def _bad(field: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{field}: {reason}", field=field)


def parse_time(value: Any, where: str) -> int:
    """Unix seconds from a number or an ISO 8601 time (naive means UTC)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise _bad(where, f"cannot read {value!r} as a time (unix seconds or ISO 8601)") from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())


def _sample(row: dict[str, Any], where: str) -> TrafficSample:
    time_key = next((k for k in TIME_COLUMNS if k in row), None)
    count_key = next((k for k in COUNT_COLUMNS if k in row), None)
    if time_key is None or count_key is None:
        raise _bad(where, f"needs a time ({'/'.join(TIME_COLUMNS)}) and a count ({'/'.join(COUNT_COLUMNS)})")
    try:
        requests = float(row[count_key])
    except (TypeError, ValueError):
        raise _bad(f"{where}.{count_key}", f"not a number: {row[count_key]!r}") from None
    if not math.isfinite(requests) or requests < 0:
        raise _bad(f"{where}.{count_key}", f"must be a count of at least 0 (got {row[count_key]!r})")
    return TrafficSample(parse_time(row[time_key], f"{where}.{time_key}"), requests)


def load_traffic(path: str | Path) -> list[TrafficSample]:
    """Hourly request counts from CSV (a header with hour,requests) or JSON (a list of
    {"hour": ..., "requests": ...} or an object {time: requests})."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise _bad("file", f"cannot read {file}: {exc.strerror}") from exc
    if file.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _bad("file", f"{file} is not valid JSON: {exc}") from exc
        if isinstance(data, dict):
            data = [{"hour": k, "requests": v} for k, v in data.items()]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise _bad("file", f"{file} must hold a list of {{hour, requests}} objects or a {{time: requests}} object")
        rows = [{k.lower(): v for k, v in r.items()} for r in data]
    else:
        rows = [{(k or "").strip().lower(): v for k, v in r.items()} for r in csv.DictReader(text.splitlines())]
    samples = [_sample(r, f"row {i + 1}") for i, r in enumerate(rows)]
    if not samples:
        raise _bad("file", f"{file} holds no samples")
    return samples
