"""The api's gauges of what it owns (jobs, nodes, their GPUs), read from Postgres at scrape time.

    rota_jobs{state, kind, tenant}               jobs in each state (final states included)
    rota_node_gpus{node, state}                  allocated | idle | bad: their sum is the node's GPUs
    rota_node_heartbeat_age_seconds{node}        since the node's last heartbeat
    rota_node_health{node, health}               1 for the node's health (ALIVE, SUSPECT, DEAD, ...)
    rota_job_progress{job, tenant, kind, key}    each numeric value a running job reports
                                                 (loss, step, an agentic batch's window and hit
                                                 rate, an overlap plan's predicted step time)

Job ids label only rota_job_progress, and only running jobs': a job's series leave with
it (each read takes the RUNNING jobs anew, nothing is kept between reads). Its size is
bounded three ways (`progress_series`): a key's label at most MAX_PROGRESS_KEY_CHARS
characters, at most MAX_PROGRESS_KEYS keys a job, at most MAX_PROGRESS_SERIES series in
all (jobs in id order, so the same ones are kept from one read to the next); what is left
out counts in rota_job_progress_series_dropped{reason}. No histogram carries a job id.

Read once per scrape interval at most (`CachedCollector`), in three grouped queries; an
api with several workers answers from each, so a dashboard takes max() over instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.orm import Session

from rota.cluster import queries
from rota.cluster.job_lifecycle import utcnow
from rota.common import read_models
from rota.common.db import Database
from rota.common.metrics import PROGRESS_DROPPED, REGISTRY, CachedCollector, gauge


def cluster_families(session: Session) -> list[GaugeMetricFamily]:
    counts = queries.cluster_counts(session)
    jobs, gpus, claimed, nodes, running = (counts[k] for k in ("jobs", "gpus", "claimed", "nodes", "running"))
    bad = read_models.bad_gpus(session)
    progress = progress_series(running)
    for reason, n in progress.dropped.items():
        if n:
            PROGRESS_DROPPED.labels(reason=reason).inc(n)
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
              ["job", "tenant", "kind", "key"], progress.series),
    ]


MAX_PROGRESS_KEYS = 16  # a job that reports more shows its first ones, in its own order
MAX_PROGRESS_KEY_CHARS = 64  # a longer key's label is cut there (report's keys are the job's own text)
MAX_PROGRESS_SERIES = 4096  # rota_job_progress series in all: a scrape stays small however many jobs run


@dataclass
class ProgressSeries:
    series: list[tuple[tuple[str, str, str, str], float]] = field(default_factory=list)
    # Values left out: past a job's MAX_PROGRESS_KEYS ("keys"), past MAX_PROGRESS_SERIES ("series").
    dropped: dict[str, int] = field(default_factory=lambda: {"keys": 0, "series": 0})


def progress_series(running: Sequence[tuple[str, str, str, object]], *,
                    max_series: int = MAX_PROGRESS_SERIES) -> ProgressSeries:
    """rota_job_progress's series from the running jobs' (id, tenant, kind, progress), bounded."""
    out = ProgressSeries()
    for job, tenant, kind, progress in running:
        values = numeric_progress(progress, limit=None)
        out.dropped["keys"] += max(0, len(values) - MAX_PROGRESS_KEYS)
        for key, value in values[:MAX_PROGRESS_KEYS]:
            if len(out.series) >= max_series:
                out.dropped["series"] += 1
                continue
            out.series.append(((job, tenant, kind, key), value))
    return out


def numeric_progress(progress: object, *, limit: int | None = MAX_PROGRESS_KEYS) -> list[tuple[str, float]]:
    """The numeric values of a job's progress (booleans, text and nested values left out),
    each key cut to MAX_PROGRESS_KEY_CHARS (two keys alike in their first characters: the
    first one kept), the first `limit` of them."""
    if not isinstance(progress, dict):
        return []
    found: dict[str, float] = {}
    for k, v in progress.items():
        key = str(k)[:MAX_PROGRESS_KEY_CHARS]
        if isinstance(v, int | float) and not isinstance(v, bool) and v == v and key not in found:
            found[key] = float(v)
    return list(found.items())[:limit]


def register_cluster_metrics(db: Database) -> CachedCollector:
    collector = CachedCollector(lambda: db.run(cluster_families))
    REGISTRY.register(collector)
    return collector
