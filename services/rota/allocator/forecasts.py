"""What the plan assumes about each job, from the forecaster (docs/design.md §5), with fallbacks.

Batch-like jobs are planned on the forecaster's duration at a quantile (P50 by default),
realtime apps on its demand curve built from their traffic. Each job's forecast is asked
for once and cached (a spec never changes), and jobs whose specs give the forecaster the
same inputs share one call for a minute; curves are asked for once per plan step. When the
forecaster is not configured, down or has nothing to go on, a job keeps its declared
duration and an app its declared `demand`: the plan never waits on a forecast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import grpc

from rota.common import convert
from rota.common.tls import TLSFiles, open_aio_channel
from rota.core.forecasting.own_runs import run_key
from rota.core.jobspec import JobSpecData
from rota.core.planning.liveplan import Horizon, LiveJob
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc

log = logging.getLogger(__name__)
RPC_TIMEOUT_S = 3.0
CONCURRENT_CALLS = 16
MIN_CURVE_STEP_S = 60  # the forecaster's demand curves have minute resolution at best
SHARED_FOR_S = 60.0  # a signature's forecast serves new jobs this long (the model refits meanwhile)


def _signature(spec: dict[str, Any]) -> tuple[Any, ...]:
    """What a forecast depends on: the spec's kind, features, GPUs and declared duration, and the
    job's identity across submissions (its own earlier runs answer first)."""
    features = json.dumps(spec.get("features") or {}, sort_keys=True, default=str)
    own = run_key(str(spec.get("tenant") or ""), spec)
    return spec.get("kind") or "training", features, spec.get("gpus") or 1, spec.get("duration_seconds"), own


@dataclass(frozen=True)
class Forecast:
    planned_seconds: float | None  # what the plan assumes
    declared_seconds: float | None
    model: str  # "declared" when no forecast was used
    p50_seconds: float = 0.0
    p90_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Forecasts:
    def __init__(
        self, address: str | None, admin_token: str, quantile: float = 0.5, *, tls: TLSFiles | None = None
    ) -> None:
        self.quantile = quantile
        self._metadata = (("authorization", f"Bearer {admin_token}"),)
        self._stub = forecaster_pb2_grpc.ForecasterServiceStub(open_aio_channel(address, tls)) if address else None
        self._jobs: dict[str, Forecast] = {}
        self._shared: dict[tuple[Any, ...], tuple[float, Forecast]] = {}  # signature -> (when, forecast)
        self._curves: dict[tuple[str, int], tuple[int, ...] | None] = {}
        self._retry_after = 0.0  # after a failure, stop asking for a while

    async def apply(self, jobs: list[LiveJob], specs: dict[str, dict[str, Any]], horizon: Horizon) -> tuple[list[LiveJob], dict[str, Forecast]]:
        """The jobs with forecast durations and curves, and the forecast each job was planned on."""
        if self._stub is not None and time.monotonic() >= self._retry_after:
            # Jobs with the same signature (what the forecaster reads of a spec) share one
            # prediction: a burst of array jobs costs the forecaster one call, not one each.
            groups: dict[tuple[Any, ...], list[str]] = {}
            for j in jobs:
                if not j.realtime and j.id not in self._jobs:
                    groups.setdefault(_signature(specs[j.id]), []).append(j.id)
            now = time.monotonic()
            self._shared = {k: v for k, v in self._shared.items() if now - v[0] < SHARED_FOR_S}
            gate = asyncio.Semaphore(CONCURRENT_CALLS)
            await asyncio.gather(*(self._predict(key, ids, specs[ids[0]], gate) for key, ids in groups.items()))
            apps = [j for j in jobs if j.realtime and (j.id, horizon.step_index) not in self._curves]
            await asyncio.gather(*(self._curve(j, specs[j.id], horizon, gate) for j in apps))
        out: list[LiveJob] = []
        used: dict[str, Forecast] = {}
        for j in jobs:
            if j.realtime:
                curve = self._curves.get((j.id, horizon.step_index))
                out.append(replace(j, demand=curve, demand_from_now=True) if curve else j)
                continue
            fc = self._jobs.get(j.id) or Forecast(j.duration_s, j.duration_s, "declared")
            used[j.id] = fc
            out.append(replace(j, duration_s=fc.planned_seconds))
        self._forget(jobs)
        return out, used

    async def _predict(self, key: tuple[Any, ...], job_ids: list[str], spec: dict[str, Any],
                       gate: asyncio.Semaphore) -> None:
        assert self._stub is not None
        shared = self._shared.get(key)
        if shared is None:
            forecast = await self._ask(spec, gate)
            if forecast is None:
                return
            shared = self._shared[key] = (time.monotonic(), forecast)
        for job_id in job_ids:
            self._jobs[job_id] = shared[1]

    async def _ask(self, spec: dict[str, Any], gate: asyncio.Semaphore) -> Forecast | None:
        assert self._stub is not None
        declared = spec.get("duration_seconds")
        request = forecaster_pb2.PredictJobRequest(spec=convert.spec_to_proto(JobSpecData.from_dict(spec)), quantile=self.quantile)
        async with gate:
            try:
                reply = await self._stub.PredictJob(request, timeout=RPC_TIMEOUT_S, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # nothing to forecast from
                    return Forecast(declared, declared, "declared")
                self._back_off(exc)
                return None
        return Forecast(reply.duration_seconds, declared, reply.model, reply.duration_p50_seconds, reply.duration_p90_seconds)

    async def _curve(self, app: LiveJob, spec: dict[str, Any], horizon: Horizon, gate: asyncio.Semaphore) -> None:
        assert self._stub is not None
        key = (app.id, horizon.step_index)
        if horizon.step_s < MIN_CURVE_STEP_S:
            self._curves[key] = None
            return
        request = forecaster_pb2.DemandCurveRequest(
            app=str(spec.get("name", "")), horizon=horizon.steps, step_seconds=int(horizon.step_s),
            max_swap=app.max_swap, start_unix=int(horizon.now_s),
        )
        async with gate:
            try:
                reply = await self._stub.DemandCurve(request, timeout=RPC_TIMEOUT_S, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    self._back_off(exc)
                self._curves[key] = None  # no traffic or no capacity yet: its declared demand
                return
        self._curves[key] = tuple(reply.gpus) or None

    def _back_off(self, exc: grpc.aio.AioRpcError) -> None:
        log.warning("forecaster unavailable (%s): planning on declared durations for a minute", exc.code())
        self._retry_after = time.monotonic() + 60

    def _forget(self, jobs: list[LiveJob]) -> None:
        live = {j.id for j in jobs}
        self._jobs = {k: v for k, v in self._jobs.items() if k in live}
        self._curves = {k: v for k, v in self._curves.items() if k[0] in live}
