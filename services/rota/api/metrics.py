"""The api's gauges of what it owns (jobs, nodes, their GPUs), read from Postgres at scrape time.

    rota_jobs{state, kind, tenant}               jobs in each state (final states included)
    rota_node_gpus{node, state}                  allocated | idle | bad: their sum is the node's GPUs
    rota_node_heartbeat_age_seconds{node}        since the node's last heartbeat
    rota_node_health{node, health}               1 for the node's health (ALIVE, SUSPECT, DEAD, ...)
    rota_job_progress{job, tenant, kind, key}    each numeric value a running job reports
                                                 (loss, step, an agentic batch's window and hit
                                                 rate, an overlap plan's predicted step time)

Job ids label only rota_job_progress, and only running jobs' (bounded by what runs at once,
times the keys each reports, at most MAX_PROGRESS_KEYS a job); no histogram carries one.

Read once per scrape interval at most (`CachedCollector`), in three grouped queries; an
api with several workers answers from each, so a dashboard takes max() over instances.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.orm import Session

from rota.cluster import queries
from rota.cluster.job_lifecycle import utcnow
from rota.common import read_models
from rota.common.db import Database
from rota.common.metrics import REGISTRY, CachedCollector, gauge


def cluster_families(session: Session) -> list[GaugeMetricFamily]:
    counts = queries.cluster_counts(session)
    jobs, gpus, claimed, nodes, running = (counts[k] for k in ("jobs", "gpus", "claimed", "nodes", "running"))
    bad = read_models.bad_gpus(session)
    now = utcnow()
    per_node: list[tuple[tuple[str, ...], float]] = []
    for name, total in sorted(gpus.items()):
        held, broken = claimed.get(name, 0), len(bad.get(name, ()))
        per_node += [((name, "allocated"), held), ((name, "bad"), broken),
                     ((name, "idle"), max(0, total - held - broken))]
    return [
        gauge("rota_jobs", "Jobs in each state, by kind and tenant", ["state", "kind", "tenant"],
              (((s, k, t), n) for s, k, t, n in jobs)),
        gauge("rota_node_gpus", "A node's GPUs: allocated, idle or bad (their sum: all of them)", ["node", "state"],
              per_node),
        gauge("rota_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat", ["node"],
              (((n,), max(0.0, (now - at).total_seconds())) for n, _h, at in nodes)),
        gauge("rota_node_health", "1 for the node's current health", ["node", "health"],
              (((n, h), 1.0) for n, h, _at in nodes)),
        gauge("rota_job_progress", "A running job's reported numeric progress values (rota.runtime.report)",
              ["job", "tenant", "kind", "key"],
              (((job, tenant, kind, key), value) for job, tenant, kind, progress in running
               for key, value in numeric_progress(progress))),
    ]


MAX_PROGRESS_KEYS = 16  # a job that reports more shows its first ones, in its own order


def numeric_progress(progress: object) -> list[tuple[str, float]]:
    """The numeric values of a job's progress (booleans, text and nested values left out)."""
    if not isinstance(progress, dict):
        return []
    found = [(str(k), float(v)) for k, v in progress.items()
             if isinstance(v, int | float) and not isinstance(v, bool) and v == v]
    return found[:MAX_PROGRESS_KEYS]


def register_cluster_metrics(db: Database) -> CachedCollector:
    collector = CachedCollector(lambda: db.run(cluster_families))
    REGISTRY.register(collector)
    return collector
