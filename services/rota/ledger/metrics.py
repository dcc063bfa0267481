"""The ledger's gauges of fairness, from its standings at scrape time (the window's figures).

    rota_tenant_fairness_ratio{tenant}          F = U / D: 1 is its fair share, below it owed
                                                (no series for a tenant without demand in the window: n/a)
    rota_tenant_used_gpu_seconds{tenant, weighted}   U in the window, raw ("false") and by GPU type rate
    rota_tenant_deserved_gpu_seconds{tenant}    D in the window
    rota_tenant_quota_gpus{tenant}              its share of the live GPUs
    rota_cluster_capacity_gpus                  live GPUs the quotas divide
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.orm import Session

from rota.common.db import Database
from rota.common.metrics import REGISTRY, CachedCollector, gauge
from rota.core.fairness.ltgf import ratio
from rota.ledger.repository import standings


def fairness_families(session: Session) -> list[GaugeMetricFamily]:
    st = standings(session)
    used = [((t.tenant, "true"), t.used) for t in st.tenants] + [((t.tenant, "false"), t.raw_used) for t in st.tenants]
    return [
        gauge("rota_tenant_fairness_ratio", "F = U / D over the window: 1 is the fair share", ["tenant"],
              (((t.tenant,), ratio(t.used, t.deserved)) for t in st.tenants if t.deserved > 0)),
        gauge("rota_tenant_used_gpu_seconds", "GPU-seconds used in the window (weighted: by GPU type rate)",
              ["tenant", "weighted"], used),
        gauge("rota_tenant_deserved_gpu_seconds", "GPU-seconds deserved in the window", ["tenant"],
              (((t.tenant,), t.deserved) for t in st.tenants)),
        gauge("rota_tenant_quota_gpus", "The tenant's share of the live GPUs", ["tenant"],
              (((t.tenant,), float(t.quota)) for t in st.tenants)),
        gauge("rota_cluster_capacity_gpus", "Live GPUs that the quotas divide", [], [((), float(st.capacity))]),
    ]


def register_fairness_metrics(db: Database) -> CachedCollector:
    collector = CachedCollector(lambda: db.run(fairness_families))
    REGISTRY.register(collector)
    return collector
