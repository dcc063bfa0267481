"""The api's gauges of what it owns (jobs, nodes, their GPUs), read from Postgres at scrape time.

    rota_jobs{state, kind, tenant}               jobs in each state (final states included)
    rota_node_gpus{node, state}                  allocated | idle | bad: their sum is the node's GPUs
    rota_node_heartbeat_age_seconds{node}        since the node's last heartbeat
    rota_node_health{node, health}               1 for the node's health (ALIVE, SUSPECT, DEAD, ...)

Read once per scrape interval at most (`CachedCollector`), in three grouped queries; an
api with several workers answers from each, so a dashboard takes max() over instances.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rota.common import read_models
from rota.common.db import Database
from rota.common.jobs_repo import utcnow
from rota.common.metrics import REGISTRY, CachedCollector, gauge
from rota.common.models import GpuClaimRow, GpuRow, JobRow, NodeRow


def cluster_families(session: Session) -> list[GaugeMetricFamily]:
    jobs = session.execute(
        select(JobRow.state, JobRow.kind, JobRow.tenant, func.count()).group_by(JobRow.state, JobRow.kind, JobRow.tenant)
    ).all()
    gpus = dict(session.execute(select(GpuRow.node, func.count()).group_by(GpuRow.node)).tuples().all())
    claimed = dict(session.execute(select(GpuClaimRow.node, func.count()).group_by(GpuClaimRow.node)).tuples().all())
    bad = read_models.bad_gpus(session)
    nodes = session.execute(select(NodeRow.name, NodeRow.health, NodeRow.last_heartbeat)).all()
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
    ]


def register_cluster_metrics(db: Database) -> CachedCollector:
    collector = CachedCollector(lambda: db.run(cluster_families))
    REGISTRY.register(collector)
    return collector
