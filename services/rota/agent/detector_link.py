"""The agent's link to the failure detector: iteration reports and rank heartbeats.

Jobs carry no token and cannot reach the control plane, so `rota.runtime` appends JSON
lines to the job's `ROTA_ITERATIONS_FILE` and this link, once a heartbeat interval,
(1) forwards each new iteration line to the detector's ReportIteration, (2) sends one
heartbeat on the stream of every rank that reported or beat since the last tick (one
client stream per rank; the detector's timeout is three intervals), and (3) closes the
streams of jobs that ended, so the detector forgets them instead of calling them dead.
A hung rank writes nothing, its stream goes quiet, and the detector notices.
With no detector address (ROTA_DETECTOR_ADDR unset) the link does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from rota.agent.processes import LocalJob, ProcessTable
from rota.common.config import Settings
from rota.common.tls import open_aio_channel, tls_files
from rota.v1 import detector_pb2, detector_pb2_grpc

log = logging.getLogger("rota.agent.detector")
ITERATIONS_FILE = "iterations.jsonl"  # under the job's folder; ProcessTable names it in ROTA_ITERATIONS_FILE
MAX_READ = 4 << 20  # bytes of new lines read per job per tick
RankKey = tuple[str, int, int]  # (job id, epoch, rank)


def report_request(job: LocalJob, line: dict[str, Any]) -> detector_pb2.ReportIterationRequest:
    """A runtime line as ReportIteration (negative seconds mark ranks that did not report)."""
    layout = line["layout"]
    micro = line["micro_batches"]
    return detector_pb2.ReportIterationRequest(
        job_id=job.job_id, epoch=job.epoch, iteration=int(line["iteration"]),
        rank_seconds=[-1.0 if s is None else float(s) for s in line["rank_seconds"]],
        sequence_lengths=[int(n) for mbs in micro for mb in mbs for n in mb],
        sequences_per_micro_batch=[len(mb) for mbs in micro for mb in mbs],
        layout=detector_pb2.Layout(tp=int(layout["tp"]), pp=int(layout["pp"]), dp=int(layout["dp"]),
                                   stage_of_rank=[int(s) for s in layout.get("stages") or ()]),
        iteration_seconds=float(line.get("iteration_seconds") or 0.0),
        predicted_iteration_seconds=float(line.get("predicted_seconds") or 0.0),
    )


def beating_ranks(line: dict[str, Any]) -> set[int]:
    if "beat" in line:
        return {int(r) for r in line["beat"]}
    return {r for r, s in enumerate(line.get("rank_seconds") or ()) if s is not None}


class RankStream:
    """One rank's heartbeat stream: beats go through a queue; None ends it gracefully."""

    def __init__(self, stub: detector_pb2_grpc.DetectorServiceAsyncStub, metadata: tuple[tuple[str, str], ...],
                 key: RankKey, interval_s: float) -> None:
        self.key = key
        self.interval_s = interval_s
        self.queue: asyncio.Queue[detector_pb2.HeartbeatRequest | None] = asyncio.Queue()
        self.sequence = 0
        self.refused = False  # the detector said this copy is stale: never reopen
        self.task = asyncio.ensure_future(self._run(stub, metadata))

    async def _requests(self) -> AsyncIterator[detector_pb2.HeartbeatRequest]:
        while (item := await self.queue.get()) is not None:
            yield item

    async def _run(self, stub: detector_pb2_grpc.DetectorServiceAsyncStub, metadata: tuple[tuple[str, str], ...]) -> None:
        try:
            async for _ack in stub.Heartbeat(self._requests(), metadata=metadata):
                pass
        except grpc.aio.AioRpcError as exc:
            self.refused = exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                                          grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)
            log.warning("heartbeat stream of %s rank %d ended: %s %s", self.key[0], self.key[2],
                        exc.code().name, exc.details())

    @property
    def open(self) -> bool:
        return not self.task.done()

    def beat(self) -> None:
        job_id, epoch, rank = self.key
        self.sequence += 1
        self.queue.put_nowait(detector_pb2.HeartbeatRequest(
            source=f"job/{job_id}/rank/{rank}", sequence=self.sequence, job_id=job_id, rank=rank, epoch=epoch,
            interval_seconds=self.interval_s,
        ))

    async def close(self) -> None:
        self.queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 5.0)
        except TimeoutError:
            self.task.cancel()


class DetectorLink:
    def __init__(self, settings: Settings, table: ProcessTable) -> None:
        self.address = settings.service_addrs.get("detector", "")
        self.tls = tls_files(settings)  # mutual TLS when the cluster runs with it
        self.interval_s = settings.heartbeat_interval_s
        self.metadata = (("authorization", f"Bearer {settings.admin_token}"),)
        self.table = table
        self.offsets: dict[tuple[str, int], int] = {}
        self.streams: dict[RankKey, RankStream] = {}
        self.stub: detector_pb2_grpc.DetectorServiceAsyncStub | None = None

    async def run_forever(self) -> None:
        if not self.address:
            return
        channel = open_aio_channel(self.address, self.tls)
        self.stub = detector_pb2_grpc.DetectorServiceStub(channel)
        try:
            while True:
                try:
                    await self.tick()
                except Exception:  # noqa: BLE001 - the link must outlive any one failure
                    log.exception("detector link cycle failed")
                await asyncio.sleep(self.interval_s)
        finally:
            for stream in list(self.streams.values()):
                stream.task.cancel()
            await channel.close(None)

    async def tick(self) -> None:
        assert self.stub is not None
        beating: set[RankKey] = set()
        live: set[tuple[str, int]] = set()
        for job in list(self.table.jobs.values()):
            running = job.exit_code() is None
            for line in self._new_lines(job):
                if "iteration" in line:
                    await self._forward(job, line)
                if running:
                    beating |= {(job.job_id, job.epoch, r) for r in beating_ranks(line)}
            if running:
                live.add((job.job_id, job.epoch))
        for key in beating:
            stream = self.streams.get(key)
            if stream is not None and stream.refused:
                continue
            if stream is None or not stream.open:
                stream = self.streams[key] = RankStream(self.stub, self.metadata, key, self.interval_s)
            stream.beat()
        for key in [k for k in self.streams if k[:2] not in live]:  # the job ended here: goodbye, not silence
            await self.streams.pop(key).close()
        self.offsets = {k: v for k, v in self.offsets.items() if k in {(j.job_id, j.epoch) for j in self.table.jobs.values()}}

    def _new_lines(self, job: LocalJob) -> list[dict[str, Any]]:
        path: Path = job.folder / ITERATIONS_FILE
        at = self.offsets.get((job.job_id, job.epoch), 0)
        try:
            with path.open("rb") as f:
                f.seek(at)
                data = f.read(MAX_READ)
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next tick
        self.offsets[(job.job_id, job.epoch)] = at + len(complete)
        out = []
        for raw in complete.splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                log.warning("%s: skipping a line that is not JSON in %s", job.job_id, path)
                continue
            if isinstance(line, dict):
                out.append(line)
        return out

    async def _forward(self, job: LocalJob, line: dict[str, Any]) -> None:
        assert self.stub is not None
        try:
            request = report_request(job, line)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s: skipping a malformed iteration line: %s", job.job_id, exc)
            return
        try:
            await self.stub.ReportIteration(request, timeout=max(2.0, 2 * self.interval_s), metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:  # a report lost to an outage is one fewer sample, no more
            log.warning("%s: iteration %d not reported: %s %s", job.job_id, request.iteration, exc.code().name, exc.details())
