"""What the plan assumes about each job, from the forecaster (SPEC §5), with fallbacks.

Batch-like jobs are planned on the forecaster's duration at a quantile (P50 by default),
realtime apps on its demand curve built from their traffic. Each job's forecast is asked
for once and cached (a spec never changes), curves once per plan step. When the
forecaster is not configured, down or has nothing to go on, a job keeps its declared
duration and an app its declared `demand`: the plan never waits on a forecast.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import grpc

from rota.allocator.liveplan import Horizon, LiveJob
from rota.common import convert
from rota.common.jobspec import JobSpecData
from rota.common.tls import TLSFiles, open_aio_channel
from rota.v1 import forecaster_pb2, forecaster_pb2_grpc

log = logging.getLogger(__name__)
RPC_TIMEOUT_S = 3.0
CONCURRENT_CALLS = 16
MIN_CURVE_STEP_S = 60  # the forecaster's demand curves have minute resolution at best


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
        self._curves: dict[tuple[str, int], tuple[int, ...] | None] = {}
        self._retry_after = 0.0  # after a failure, stop asking for a while

    async def apply(self, jobs: list[LiveJob], specs: dict[str, dict[str, Any]], horizon: Horizon) -> tuple[list[LiveJob], dict[str, Forecast]]:
        """The jobs with forecast durations and curves, and the forecast each job was planned on."""
        if self._stub is not None and time.monotonic() >= self._retry_after:
            missing = [j for j in jobs if not j.realtime and j.id not in self._jobs]
            gate = asyncio.Semaphore(CONCURRENT_CALLS)
            await asyncio.gather(*(self._predict(j.id, specs[j.id], gate) for j in missing))
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

    async def _predict(self, job_id: str, spec: dict[str, Any], gate: asyncio.Semaphore) -> None:
        assert self._stub is not None
        declared = spec.get("duration_seconds")
        request = forecaster_pb2.PredictJobRequest(spec=convert.spec_to_proto(JobSpecData.from_dict(spec)), quantile=self.quantile)
        async with gate:
            try:
                reply = await self._stub.PredictJob(request, timeout=RPC_TIMEOUT_S, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # nothing to forecast from
                    self._jobs[job_id] = Forecast(declared, declared, "declared")
                else:
                    self._back_off(exc)
                return
        self._jobs[job_id] = Forecast(reply.duration_seconds, declared, reply.model, reply.duration_p50_seconds,
                                      reply.duration_p90_seconds)

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
