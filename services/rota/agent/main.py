"""Composition root of a node agent: devices, process table, AgentService, heartbeats.

The heartbeat loop (1) renews the lease file the job launchers watch, (2) reports every
job's state, exit and progress to the control plane, (3) reconciles: launches what the
control plane placed here and this agent does not run, stops what it runs and should not.
It talks to the api's NodeService at ROTA_API_NODE_ADDR (--api-node), the api's node port;
unset, at the api's default node port (ROTA_API_ADDR's port + NODE_PORT_OFFSET).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc

from rota.agent import cgroups as cgroups_module
from rota.agent import declared
from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.detector_link import DetectorLink
from rota.agent.gpus import discover
from rota.agent.metrics import register_gpu_metrics
from rota.agent.processes import LocalJob, ProcessTable
from rota.agent.service import AgentRuntime, AgentService, report_of
from rota.agent.streaming import StagedStreams
from rota.common import metrics
from rota.common.auth import ADMIN, Identity
from rota.common.config import NODE_PORT_OFFSET, Settings, default_node_listen
from rota.common.layouts import layout_text
from rota.common.metrics import serve_metrics
from rota.common.server import RotaInterceptor, run_server
from rota.common.telemetry import job_logging, setup_logging, setup_tracing, shutdown_tracing
from rota.common.tls import open_aio_channel, tls_files
from rota.core.errors import DomainError
from rota.v1 import agent_pb2, agent_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

log = logging.getLogger("rota.agent")
LEASE_FRACTION = 0.6  # of the node timeout: the launcher's lease expires well before the verdict
# After a launch the next heartbeat comes early: EARLY_GATHER_S later (launches of one plan
# arrive together and share it), and never sooner than EARLY_MIN_GAP_S after the previous
# early one, so a burst of launches costs the api at most a few more beats a second.
EARLY_GATHER_S = 0.02
EARLY_MIN_GAP_S = 0.25
# A failed beat (the api starting or restarting) is tried again this soon when the interval
# is longer: an agent starting beside the api registers within a second, not an interval.
FAILED_RETRY_S = 1.0
# An agent started beside the api (`rota up`, a pod restart) beats before the api listens:
# until the api has answered once, or for this long after the agent's start, an unreachable
# api is logged at DEBUG; after that every failed beat is an outage, logged at WARNING.
STARTUP_GRACE_S = 30.0
_STARTING_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
TIME_LIMIT_GRACE_S = 10.0  # a job past its time limit has this long after SIGTERM to exit


class Heartbeats:
    def __init__(self, settings: Settings, runtime: AgentRuntime, address: str, devices: list[common_pb2.Gpu],
                 labels: dict[str, str] | None = None, capacity: tuple[float, int] = (0.0, 0)) -> None:
        self.settings = settings
        self.runtime = runtime
        self.address = address
        self.devices = devices
        self.labels = labels or {}  # the node's place in the network (switch, rack), sent on Register
        self.capacity = capacity  # (CPUs, memory bytes) jobs may reserve, sent on Register
        self.metadata = (("authorization", f"Bearer {settings.admin_token}"),)
        # NodeService on the api's node port; without its address, where the api serves it
        # by default (its public port + NODE_PORT_OFFSET).
        node_addr = settings.api_node_addr or default_node_listen(settings.api_addr)
        self.channel = open_aio_channel(node_addr, tls_files(settings))
        self.nodes = node_pb2_grpc.NodeServiceStub(self.channel)
        self.registered = False
        self._early_at = float("-inf")  # monotonic time of the last early beat
        self.started_at = time.monotonic()
        self.reached = False  # the api has answered once
        self._stopping: dict[tuple[str, int], asyncio.Task[None]] = {}  # (job, epoch): stops under way

    async def keep_lease(self) -> None:
        """Renews the lease file its jobs' launchers watch, every third of its timeout, for
        as long as this process runs its event loop. Apart from the heartbeat loop, which a
        slow beat or a job slow to stop may hold up: that must not fence every job here."""
        period = max(0.05, self.runtime.table.lease_timeout_s / 3)
        while True:
            self.runtime.table.lease_file.touch()
            await asyncio.sleep(period)

    async def run_forever(self) -> None:
        while True:
            self.runtime.launched.clear()  # what launched before this beat, it reports
            interval = self.settings.heartbeat_interval_s
            try:
                await self.beat()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    self.registered = False
                metrics.HEARTBEAT_FAILURES.labels(node=self.runtime.node).inc()
                log.log(self.failure_level(exc.code()), "heartbeat failed: %s %s", exc.code().name, exc.details())
                interval = min(interval, FAILED_RETRY_S)
            except Exception:  # noqa: BLE001 - the loop must survive any one failure
                log.exception("heartbeat cycle failed")
            await self.until_next_beat(interval)

    def failure_level(self, code: grpc.StatusCode) -> int:
        starting = not self.reached and time.monotonic() - self.started_at < STARTUP_GRACE_S
        return logging.DEBUG if starting and code in _STARTING_CODES else logging.WARNING

    async def until_next_beat(self, interval: float) -> None:
        """`interval`, or less after a launch: a job's RUNNING reaches the control plane a
        moment after it starts instead of up to a whole interval later."""
        try:
            await asyncio.wait_for(self.runtime.launched.wait(), interval)
        except TimeoutError:
            return
        await asyncio.sleep(max(EARLY_GATHER_S, self._early_at + EARLY_MIN_GAP_S - time.monotonic()))
        self._early_at = time.monotonic()

    async def beat(self) -> None:
        timeout = max(1.0, self.settings.heartbeat_interval_s * 2)
        if not self.registered:
            node = common_pb2.Node(name=self.runtime.node, address=self.address, gpus=self.devices, labels=self.labels,
                                   cpus=self.capacity[0], memory_bytes=self.capacity[1])
            await self.nodes.Register(node_pb2.NodeServiceRegisterRequest(node=node), timeout=timeout,
                                      metadata=self.metadata)
            self.registered = self.reached = True
            log.info("registered %s at %s with %d GPUs (types %s, labels %s)", self.runtime.node, self.address,
                     len(self.devices), sorted({d.type for d in self.devices}), self.labels)
        sent_at = time.monotonic()
        self.runtime.table.tend_guests()
        self.stop_timed_out()
        jobs = list(self.runtime.table.jobs.values())
        reports = [report_of(j) for j in jobs]
        reply = await self.nodes.Heartbeat(
            node_pb2.NodeServiceHeartbeatRequest(node=self.runtime.node, jobs=reports), timeout=timeout,
            metadata=self.metadata,
        )
        self.reached = True
        finished = [j for j, r in zip(jobs, reports, strict=True) if r.state != common_pb2.JOB_STATE_RUNNING]
        self.runtime.table.acknowledge_finished(finished)
        for job in finished:
            self.runtime.checkpoints.forget(job)
        await self.reconcile(reply, sent_at)

    async def reconcile(
        self, reply: node_pb2.NodeServiceHeartbeatResponse, sent_at: float,
    ) -> None:
        wanted = {a.job.id: a.job for a in reply.assignments}
        images = {a.job.id: (a.resume_image, layout_text(a), a.resume_source, a.resume_fallback_image)
                  for a in reply.assignments}
        for job in self.runtime.table.running():
            target = wanted.get(job.job_id)
            launched_after_request = job.started_at > sent_at
            if target is not None and await self._resize_replicas(job, target):
                continue  # a realtime app's missed resize: its replicas that stay run on
            if (target is None or target.epoch > job.epoch) and not launched_after_request \
                    and (job.job_id, job.epoch) not in self._stopping:
                with job_logging(job.job_id):
                    log.info("stopping %s (epoch %d): no longer placed here", job.job_id, job.epoch)
                # In the background: a job slow to stop must not hold up the next beats.
                task = asyncio.create_task(self._stop_unplaced(job.job_id, job.epoch))
                self._stopping[(job.job_id, job.epoch)] = task
        for job_id, placed in wanted.items():
            local = self.runtime.table.jobs.get(job_id)
            if local is None or local.epoch < placed.epoch:
                with job_logging(job_id):
                    try:
                        await self.runtime.launch(placed, placed.epoch, *images[job_id])
                        log.info("launched %s (epoch %d) from reconciliation", job_id, placed.epoch)
                    except DomainError as exc:
                        log.warning("not launching %s: %s", job_id, exc)

    def stop_timed_out(self) -> None:
        """Stops, in the background, each job past its time limit; it ends with the reason."""
        for job, reason in self.runtime.table.past_time_limits(time.time()):
            if (job.job_id, job.epoch) in self._stopping:
                continue
            with job_logging(job.job_id):
                log.info("stopping %s (epoch %d): %s", job.job_id, job.epoch, reason)
            stop = self.runtime.stop(job.job_id, job.epoch, reason, TIME_LIMIT_GRACE_S, verdict=True)
            task = asyncio.create_task(self._stop_quietly(job.job_id, job.epoch, stop))
            self._stopping[(job.job_id, job.epoch)] = task

    async def _stop_quietly(self, job_id: str, epoch: int, stop: Coroutine[Any, Any, bool]) -> None:
        try:
            await stop
        except DomainError as exc:
            log.info("not stopping %s: %s", job_id, exc)
        finally:
            self._stopping.pop((job_id, epoch), None)

    async def _stop_unplaced(self, job_id: str, epoch: int) -> None:
        # That epoch only: while this waited for the runtime's lock, a launch may have
        # started a newer placement of the same job here (a pause then a resume onto this
        # node), which the reply that asked for this stop knows nothing about.
        try:
            with job_logging(job_id):
                await self.runtime.stop(job_id, epoch, "no longer placed on this node", 5.0)
        except DomainError as exc:
            log.info("not stopping %s: %s", job_id, exc)
        finally:
            self._stopping.pop((job_id, epoch), None)

    async def _resize_replicas(self, job: LocalJob, target: common_pb2.Job) -> bool:
        """A replica set placed here under a newer epoch (a Resize that never arrived) is
        resized in place, not restarted; False when that is not the case or fails."""
        if not job.replicas or target.epoch <= job.epoch or not target.gpus:
            return False
        try:
            await self.runtime.resize(job.job_id, target.epoch, list(target.gpus))
        except DomainError as exc:
            log.info("not resizing %s: %s", job.job_id, exc)
            return False
        log.info("resized %s to GPUs %s (epoch %d) from reconciliation", job.job_id, list(target.gpus), target.epoch)
        return True

    async def settle(self) -> None:
        """Waits for the stops reconciliation started to end."""
        await asyncio.gather(*self._stopping.values(), return_exceptions=True)

    async def close(self) -> None:
        await self.settle()
        await self.channel.close(None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rota agent", description="Run a node agent.")
    add_agent_arguments(parser)
    return parser


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=socket.gethostname(), help="node name (default: host name)")
    parser.add_argument("--gpus", type=int, default=None, help="expose K virtual GPU slots (default: real GPUs)")
    parser.add_argument("--listen", default=None, help="host:port for AgentService (default: ROTA_LISTEN)")
    parser.add_argument("--advertise", default=None, help="address the control plane dials (default: --listen)")
    parser.add_argument("--api", default=None, help="api address (default: ROTA_API_ADDR)")
    parser.add_argument("--api-node", default=None,
                        help="the api's node port, its NodeService (default: ROTA_API_NODE_ADDR; unset: "
                             f"--api's port + {NODE_PORT_OFFSET})")
    parser.add_argument("--home", default=None, help="state folder (default: ROTA_HOME/agents/NAME)")
    parser.add_argument("--metrics-listen", default=None,
                        help="host:port for Prometheus /metrics (default: ROTA_METRICS_LISTEN; none if empty)")
    parser.add_argument("--warm-runtime", action="store_true", default=os.environ.get("ROTA_AGENT_WARM_RUNTIME") == "1",
                        help="keep a pre-started interpreter with torch imported for the next job "
                             "(rota.agent.warm_runtime; default: ROTA_AGENT_WARM_RUNTIME=1)")
    declared.add_arguments(parser)


def process_table(args: argparse.Namespace, home: Path, lease_timeout_s: float,
                  cgroups: cgroups_module.NodeCgroups | str) -> ProcessTable:
    """The node's jobs, adopted from a previous agent (fenced if its lease lapsed meanwhile)."""
    table = ProcessTable(args.name, home, home / "lease", lease_timeout_s, cgroups=cgroups)
    lapsed = table.lease_expired()
    table.lease_file.touch()
    table.adopt(fence=lapsed)
    if not isinstance(table.cgroups, str):  # what a previous agent process left behind
        table.cgroups.sweep({f"{j.job_id}-{j.epoch}" for j in table.jobs.values() if j.cgroup is not None})
    if getattr(args, "warm_runtime", False):
        table.start_warm_runtime()
    return table


async def serve(settings: Settings, args: argparse.Namespace) -> None:
    settings.require("admin_token")
    setup_logging(f"agent[{args.name}]", settings.log_format)
    tracer = setup_tracing("agent", settings.tracing, settings.otlp_endpoint)
    listen = args.listen or settings.listen
    if args.api:
        settings = dataclasses.replace(settings, api_addr=args.api)
    if getattr(args, "api_node", None):
        settings = dataclasses.replace(settings, api_node_addr=args.api_node)
    if listen.endswith(":0"):
        raise ValueError("--listen: the agent needs a fixed port the control plane can dial")
    gpu_type, labels = declared.declared(args, settings)
    home = Path(args.home) if args.home else settings.home / "agents" / args.name
    home.mkdir(parents=True, exist_ok=True)
    devices = discover(args.name, args.gpus, gpu_type)
    # A job fences itself strictly before the control plane can call its node dead and
    # start it elsewhere, so a frozen or partitioned node never leaves two running copies.
    table = process_table(args, home, LEASE_FRACTION * settings.node_timeout_s,
                          _cgroups(cgroups_module.agent_name(args.name, str(home.resolve())), settings))
    streams = StagedStreams(settings.admin_token, tls_files(settings), settings.checkpoint.streams)
    checkpoints = AgentCheckpoints(args.name, table, home, settings.checkpoint, streams)
    checkpoints.adopt()
    if checkpoints.resume_restores():
        log.info("took up the restores adopted jobs still wait for")
    runtime = AgentRuntime(args.name, table, virtual=all(d.virtual for d in devices), checkpoints=checkpoints)
    gpus = [common_pb2.Gpu(index=d.index, uuid=d.uuid, model=d.model, virtual=d.virtual, type=d.gpu_type)
            for d in devices]
    heartbeats = Heartbeats(settings, runtime, args.advertise or listen, gpus, labels, _capacity(args))
    register_gpu_metrics(args.name, table, devices)
    metrics_listen = getattr(args, "metrics_listen", None)
    serve_metrics(settings.metrics_listen if metrics_listen is None else metrics_listen, "agent", args.name)

    async def admin_only(token: str) -> Identity | None:
        return Identity(ADMIN) if token == settings.admin_token else None

    def register(server: grpc.aio.Server) -> list[str]:
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(runtime), server)
        return [agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name]

    async def on_stop() -> None:
        # A graceful agent stop leaves its jobs running (a restarted agent adopts them),
        # except when the whole local cluster goes down.
        if settings.agent_stop_jobs_on_exit:
            await asyncio.to_thread(table.stop_all, "cluster stopping", 5.0)
            await asyncio.to_thread(table.remove_cgroups)
        await heartbeats.close()
        checkpoints.close()
        if table.warm is not None:
            table.warm.close()
        shutdown_tracing()

    await run_server(
        name=f"agent {args.name}",
        listen=listen,
        register=register,
        interceptor=RotaInterceptor(tracer=tracer, authenticate=admin_only, default_deadline_s=settings.default_deadline_s,
                                    traced=settings.traced),
        max_message_bytes=settings.max_message_bytes,
        tls=tls_files(settings),
        background=[heartbeats.keep_lease, heartbeats.run_forever, DetectorLink(settings, table).run_forever],
        on_stop=on_stop,
    )


def _cgroups(agent: str, settings: Settings) -> cgroups_module.NodeCgroups | str:
    """The agent's cgroups, said at start; without them, jobs with cpus or memory are refused."""
    found = cgroups_module.detect(agent, settings.agent_cgroups)
    if isinstance(found, str):
        log.warning("cgroups unavailable: %s; jobs with cpus or memory limits will be refused", found)
    else:
        log.info("jobs run in their own cgroups: %s, under rota/%s", found.hierarchy.describe(), agent)
    return found


def _capacity(args: argparse.Namespace) -> tuple[float, int]:
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        meminfo = ""
    return declared.capacity(args, meminfo, len(os.sched_getaffinity(0)))


def run(args: argparse.Namespace) -> None:
    asyncio.run(serve(Settings.from_env(), args))


def main() -> None:
    run(build_parser().parse_args())


if __name__ == "__main__":
    main()
