"""ForecasterService: protos in, the pure models and the repository, protos out.

The models are refit from Postgres whenever a completion has been recorded since the
last fit (any replica sees every other replica's observations); database work runs in
worker threads, one transaction each.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from sqlalchemy.orm import Session

from rota.common import convert
from rota.common.auth import current_identity
from rota.common.db import Database
from rota.core.errors import InvalidArgument, NotFound
from rota.core.forecasting import realtime
from rota.core.forecasting.own_runs import run_key
from rota.core.forecasting.predict import Completion, Forecaster
from rota.forecaster import repository
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc

T = TypeVar("T")
MAX_HORIZON = 24 * 7 * 4
MAX_KEY = 160


class Models:
    """The fitted forecaster, refit when Postgres holds completions it has not seen.

    Whether it has new ones is asked at most every `check_s` (a prediction per submitted
    job must not cost a database read each under load), and at once after this service
    recorded one itself.
    """

    def __init__(self, db: Database, check_s: float = 1.0) -> None:
        self.db = db
        self.completions: list[Completion] = []
        self.last_id = 0
        self.forecaster = Forecaster()
        self._lock = asyncio.Lock()
        self.check_s = check_s
        self._checked_at = -math.inf  # monotonic time of the last look at Postgres

    def stale(self) -> None:
        """A completion was just recorded: the next prediction looks for it."""
        self._checked_at = -math.inf

    async def current(self) -> Forecaster:
        if time.monotonic() - self._checked_at < self.check_s:
            return self.forecaster
        self._checked_at = time.monotonic()
        last = await asyncio.to_thread(self.db.run, repository.last_completion_id)
        if last == self.last_id:
            return self.forecaster
        async with self._lock:
            rows = await asyncio.to_thread(self.db.run, lambda s: repository.completions_after(s, self.last_id))
            if rows:
                self.completions += [c for _, c in rows]
                self.last_id = rows[-1][0]
                self.forecaster = await asyncio.to_thread(Forecaster, list(self.completions))
        return self.forecaster


def _finite(value: float, field: str, low: float) -> float:
    if not math.isfinite(value) or value < low:
        raise InvalidArgument(field, f"must be a number of at least {low:g} (got {value})")
    return value


class ForecasterService(forecaster_pb2_grpc.ForecasterServiceServicer):
    def __init__(self, db: Database, *, now: Callable[[], float] = time.time) -> None:
        self.db = db
        self.models = Models(db)
        self.now = now

    async def tx(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.db.run, fn)

    async def PredictJob(self, request: forecaster_pb2.PredictJobRequest, context: grpc.aio.ServicerContext) -> forecaster_pb2.PredictJobResponse:
        identity = current_identity()
        quantile = request.quantile or 0.5
        if not 0 < quantile < 1:
            raise InvalidArgument("quantile", f"must be between 0 and 1 (got {quantile})")
        spec = convert.spec_from_proto(request.spec)
        forecaster = await self.models.current()
        key = run_key(spec.tenant or identity.tenant, spec.to_dict())  # the job's own runs, if it has run
        fc = forecaster.predict(spec.kind or "training", spec.features, spec.gpus or 1, spec.duration_seconds, key)
        p = fc.prediction
        return forecaster_pb2.PredictJobResponse(
            duration_p50_seconds=p.p50_seconds, duration_p90_seconds=p.p90_seconds,
            gpu_hours_p50=fc.gpu_hours_at(0.5), gpu_hours_p90=fc.gpu_hours_at(0.9), model=p.model,
            duration_p10_seconds=p.p10_seconds, duration_seconds=p.seconds_at(quantile),
            prior_seconds=p.prior_seconds or 0.0, gpu_hours_planned=fc.planned_gpu_hours or 0.0,
            observations=forecaster.observations,
        )

    async def DemandCurve(self, request: forecaster_pb2.DemandCurveRequest, context: grpc.aio.ServicerContext) -> forecaster_pb2.DemandCurveResponse:
        current_identity()
        if not request.app:
            raise InvalidArgument("app", "must not be empty")
        horizon = request.horizon or 24
        step = request.step_seconds or 3600
        if not 1 <= horizon <= MAX_HORIZON:
            raise InvalidArgument("horizon", f"must be 1..{MAX_HORIZON} steps (got {horizon})")
        if not 60 <= step <= 7 * 86400:
            raise InvalidArgument("step_seconds", f"must be 60..604800 (got {step})")
        start = request.start_unix or int(self.now())
        first_hour = start // 3600
        hours = (start + horizon * step - 1) // 3600 - first_hour + 1

        def read(session: Session) -> tuple[dict[int, float], dict[str, Any] | None]:
            samples = repository.hourly_traffic(session, request.app, first_hour - realtime.HISTORY_HOURS, first_hour)
            return samples, repository.realtime_app(session, request.app) if not request.capacity or not request.max_swap else None

        samples, app_spec = await self.tx(read)
        capacity = request.capacity or float((app_spec or {}).get("features", {}).get("capacity") or 0)
        if not capacity > 0:
            raise InvalidArgument("capacity", f"unknown for app {request.app!r}: pass it, or set features.capacity "
                                              "(requests per hour one GPU replica serves) in the app's job file")
        max_swap = request.max_swap or int((app_spec or {}).get("max_swap") or 0) or 1 << 30
        if not samples:
            raise NotFound(f"no traffic for app {request.app!r} before {start}: push some with `rota traffic push`")
        curve = await asyncio.to_thread(realtime.fit, realtime.series(samples, first_hour), first_hour, hours)

        def per_step(values: tuple[float, ...]) -> list[float]:
            out = []
            for k in range(horizon):  # a step takes the busiest hour it touches
                a = (start + k * step) // 3600 - first_hour
                b = (start + (k + 1) * step - 1) // 3600 - first_hour
                out.append(max(values[a : b + 1]))
            return out

        traffic = per_step(curve.values)
        return forecaster_pb2.DemandCurveResponse(
            gpus=realtime.to_gpus(traffic, capacity, max_swap),
            lower=[float(math.ceil(v / capacity - 1e-9)) for v in per_step(curve.lower)],
            upper=[float(math.ceil(v / capacity - 1e-9)) for v in per_step(curve.upper)],
            traffic=traffic, start_unix=start, history_hours=len(samples),
        )

    async def Observe(self, request: forecaster_pb2.ObserveRequest, context: grpc.aio.ServicerContext) -> forecaster_pb2.ObserveResponse:
        identity = current_identity()
        if len(request.key) > MAX_KEY:
            raise InvalidArgument("key", f"longer than {MAX_KEY} characters")
        if request.job_id and request.app:
            raise InvalidArgument("app", "an observation is a completion (job_id) or a traffic sample (app), not both")
        if request.app:
            if len(request.app) > 128:
                raise InvalidArgument("app", "longer than 128 characters")
            requests = _finite(request.requests, "requests", 0.0)
            if request.at_unix <= 0:
                raise InvalidArgument("at_unix", "must be a positive unix time")
            key = request.key or f"traffic:{request.app}:{request.at_unix}"
            recorded = await self.tx(lambda s: repository.record_traffic(
                s, key=key, app=request.app, at_unix=request.at_unix, requests=requests))
            return forecaster_pb2.ObserveResponse(recorded=recorded)
        if not request.job_id:
            raise InvalidArgument("job_id", "give job_id (a completion) or app (a traffic sample)")
        if len(request.job_id) > 32:
            raise InvalidArgument("job_id", "longer than 32 characters")
        identity.require_admin()
        seconds = _finite(request.duration_seconds, "duration_seconds", 1e-3)
        imported = convert.spec_from_proto(request.spec).to_dict() if request.HasField("spec") else None

        def record(session: Session) -> bool:
            spec = repository.job_spec(session, request.job_id) or imported
            if spec is None:
                raise NotFound(f"job {request.job_id} not found (pass its spec to import a completion)")
            return repository.record_completion(
                session, key=request.key or f"completion:{request.job_id}", job_id=request.job_id,
                kind=spec.get("kind") or "training", features=spec.get("features") or {}, gpus=int(spec.get("gpus") or 1),
                declared_seconds=spec.get("duration_seconds"), duration_seconds=seconds,
            )

        recorded = await self.tx(record)
        self.models.stale()
        return forecaster_pb2.ObserveResponse(recorded=recorded)
