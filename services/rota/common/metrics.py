"""Prometheus metrics of every service and agent: one registry per process, on /metrics.

Why `prometheus_client` and not OpenTelemetry's metrics SDK with its Prometheus exporter:
the names here are Prometheus's own (`rota_` prefix, base units, `_total` counters,
`_seconds` histograms) with nothing translating them; a collector can read state at
scrape time (jobs by state from Postgres), which is what a gauge of a table should do;
and it is one small pure-Python wheel. Traces stay on OpenTelemetry (rota.common.telemetry).

Every metric of every process is defined in this module, so that names never collide and
the list is in one place (docs/operators.md has it as a table). Labels are bounded sets:
methods and status codes, job states, kinds, tenants, nodes and GPU indices, never job
ids. A process serves only the metrics it records or collects; the others stay empty.

    ROTA_METRICS_LISTEN   host:port of this process's /metrics ("" = none; `rota up`
                          gives every service and agent one and lists them in cluster.json)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

disable_created_metrics()  # no `_created` series beside each counter: a dashboard never reads them
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)

# Which process this is (one time series: value 1), for dashboards to tell them apart.
COMPONENT = Gauge("rota_component_info", "This process: a service (api, allocator, ...) or a node agent",
                  ["component", "name"], registry=REGISTRY)

# Every service: its RPCs (rota.common.server) and its stores.
RPC_HANDLED = Counter("rota_rpc_server_handled", "RPCs served, by method and status code",
                      ["grpc_service", "grpc_method", "grpc_code"], registry=REGISTRY)
RPC_SECONDS = Histogram("rota_rpc_server_handling_seconds", "Time to serve an RPC (streams: their whole life)",
                        ["grpc_service", "grpc_method"], buckets=FAST_BUCKETS, registry=REGISTRY)
POSTGRES_ERRORS = Counter("rota_postgres_errors", "Database calls that failed (retried or not)",
                          ["kind"], registry=REGISTRY)
REDIS_ERRORS = Counter("rota_redis_errors", "Live-state (Redis) calls that failed; Postgres has it all",
                       ["operation"], registry=REGISTRY)

# Jobs (whichever process moves a job to RUNNING observes its wait).
QUEUE_WAIT = Histogram("rota_job_queue_wait_seconds", "Submission to the first start, per job",
                       ["kind"], buckets=WAIT_BUCKETS, registry=REGISTRY)

# The api's rota_job_progress gauge (rota.api.metrics): values of running jobs it left out,
# past a job's key cap ("keys") or the family's series cap ("series"), counted at each read.
PROGRESS_DROPPED = Counter("rota_job_progress_series_dropped",
                           "rota_job_progress values left out by its bounds, at each read of the jobs",
                           ["reason"], registry=REGISTRY)

# The allocator.
PLAN_SECONDS = Histogram("rota_plan_seconds", "A re-plan's wall time in the pure core, by policy and trigger",
                         ["policy", "trigger"], buckets=FAST_BUCKETS, registry=REGISTRY)
PLAN_OBJECTIVE = Gauge("rota_plan_objective", "The last plan's objective (docs/design.md §3), by policy",
                       ["policy"], registry=REGISTRY)
PLAN_WAITING = Gauge("rota_plan_jobs_waiting", "Jobs the last plan left waiting", registry=REGISTRY)
HELD_BACK = Gauge("rota_plan_gpus_held_back", "Free GPUs the last plan keeps for a later start, per node",
                  ["node"], registry=REGISTRY)
PREEMPTIONS = Counter("rota_preemptions", "Started jobs paused for higher-priority work (priced preemption)",
                      registry=REGISTRY)
QUOTA_RECLAIMS = Counter("rota_quota_reclaims", "Borrowers' jobs paused to give a tenant its guaranteed GPUs",
                         registry=REGISTRY)
MIGRATIONS = Counter("rota_migrations", "Started jobs moved to free an aligned block (fragmentation repair)",
                     registry=REGISTRY)
LEASE_YIELDS = Counter("rota_lease_yields", "Fair-share leases yielded, by how (paused or stopped)",
                       ["how"], registry=REGISTRY)
BUBBLE_GUESTS = Counter("rota_bubble_guests", "Trials placed as guests in running pipelines' bubbles",
                        registry=REGISTRY)
BUBBLE_TAKEOVERS = Counter("rota_bubble_guest_takeovers",
                           "Guest trials that took their host's GPUs over once the host ended", registry=REGISTRY)
LEADER = Gauge("rota_allocator_leader", "1 while this allocator replica is the leader", registry=REGISTRY)

# The detector.
VERDICTS = Counter("rota_detector_verdicts", "Health verdicts the detector reached, by kind",
                   ["kind"], registry=REGISTRY)

# The checkpoint coordinator.
CHECKPOINT_SECONDS = Histogram("rota_checkpoint_operation_seconds", "Checkpoint operations, request to end",
                               ["kind", "outcome"], buckets=SLOW_BUCKETS, registry=REGISTRY)
CHECKPOINT_BYTES = Counter("rota_checkpoint_bytes", "Image bytes: logical (the state) and stored (new chunks)",
                           ["kind"], registry=REGISTRY)
# Restores that streamed a migration's state from its source agent (rota.agent.streaming):
# bytes by where each piece came from (wire: the source agent; store: pieces it had written).
CHECKPOINT_STREAM_BYTES = Counter("rota_checkpoint_stream_bytes", "Streamed restore bytes, by where they came from",
                                  ["via"], registry=REGISTRY)
CHECKPOINT_STREAM_SECONDS = Histogram("rota_checkpoint_stream_seconds", "Streamed restores, first request to state here",
                                      buckets=SLOW_BUCKETS, registry=REGISTRY)

# Node agents (rota.agent.metrics collects, at scrape time: rota_gpu_utilization_ratio,
# rota_gpu_memory_used_bytes and rota_agent_jobs_running, per node and GPU index).
HEARTBEAT_FAILURES = Counter("rota_agent_heartbeat_failures", "Heartbeats the api did not answer",
                             ["node"], registry=REGISTRY)


class CachedCollector(Collector):
    """Families read at scrape time by `read` (Postgres, a process table), at most once per
    `ttl_s`: several scrapers, or several api workers scraped at once, cost one read. A
    failed read yields nothing (and counts as a store error), never a failed scrape."""

    def __init__(self, read: Callable[[], list[GaugeMetricFamily]], ttl_s: float = 5.0) -> None:
        self._read = read
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._families: list[GaugeMetricFamily] = []

    def describe(self) -> Iterable[Any]:
        return []  # unknown until read: registering must not query the database

    def collect(self) -> Iterable[Any]:
        with self._lock:
            if time.monotonic() - self._at >= self._ttl_s:
                try:
                    self._families = self._read()
                except Exception as exc:  # noqa: BLE001 - a scrape must not fail on a store outage
                    log.warning("metrics read failed: %s", exc)
                    POSTGRES_ERRORS.labels(kind=type(exc).__name__).inc()
                    self._families = []
                self._at = time.monotonic()
            return list(self._families)


def gauge(name: str, documentation: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def split_method(method: str) -> tuple[str, str]:
    """'/rota.v1.ApiService/Submit' -> ('rota.v1.ApiService', 'Submit')."""
    service, _, name = method.lstrip("/").partition("/")
    return service or "unknown", name or "unknown"


def serve_metrics(listen: str, component: str, name: str = "") -> int:
    """Serves /metrics on `listen` (host:port; port 0 picks one) in a thread; the port, or
    0 when `listen` is empty. Marks this process as `component` (and `name`: a node)."""
    COMPONENT.labels(component=component, name=name or component).set(1)
    if not listen:
        return 0
    host, _, port = listen.rpartition(":")
    try:
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=REGISTRY)
    except (OSError, ValueError) as exc:
        raise ValueError(f"ROTA_METRICS_LISTEN: cannot serve /metrics on {listen!r}: {exc}") from exc
    return int(server.server_port)
