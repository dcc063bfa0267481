"""Reports of a realtime app that runs on several nodes (one lease per node, rota.cluster.app_replicas).

Each node's agent reports its own replicas under its own epoch. The app's progress is the
sum of its nodes' counters (`served`, `replicas`) with each node's last report kept under
`nodes`, so the cumulative `served` the forecaster samples never falls when a node leaves.
Replicas that end on one node (they exited, or failed) end that node's lease only; the app
ends (as a job on one node would) only with its last node, which `rota.api.repository`
handles as before.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Set
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session

from rota.cluster import app_replicas
from rota.cluster.job_lifecycle import Events, transition
from rota.cluster.models import JobRow
from rota.core import jobstate, node_reports

SUMMED = ("served", "replicas")  # counters of one node's replicas that add up across nodes
DEPARTED = "served_departed"  # what nodes the app has left had served


class Report(Protocol):
    state: str
    exit_code: int
    error: str
    progress: dict[str, object] | None


R = TypeVar("R", bound=Report)


def merge_progress(current: Mapping[str, Any], node: str, report: Mapping[str, Any], nodes: Set[str]) -> dict[str, Any]:
    """The app's progress after `node` reported `report`; `nodes` are those it runs on now."""
    per = {n: dict(p) for n, p in (current.get("nodes") or {}).items() if isinstance(p, dict)}
    departed = _number(current.get(DEPARTED))
    for gone in [n for n in per if n not in nodes]:
        departed += _number(per.pop(gone).get("served"))
    per[node] = dict(report)
    merged: dict[str, Any] = {**report, "nodes": per}
    for key in SUMMED:
        values = [p[key] for p in per.values() if isinstance(p.get(key), int | float)]
        if values:
            merged[key] = sum(values) + (departed if key == "served" else 0)
    if departed:
        merged[DEPARTED] = departed
    return merged


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def apply_node_report(session: Session, job: JobRow, node: str, report: R, events: Events) -> R | None:
    """An app's report from one of its nodes. When the app runs on `node` alone, what the
    caller applies as a single-node job's report (without its progress once the app has run
    on several nodes: that stays merged); None when it is applied here."""
    nodes = set(app_replicas.leases(job))
    merged_before = "nodes" in (job.progress or {})
    if nodes <= {node} and not merged_before:
        return report
    if report.progress is not None:
        merged = merge_progress(job.progress or {}, node, report.progress, nodes)
        if merged != job.progress:
            job.progress = merged
            events.add(job, "progress")
    if nodes <= {node}:
        rest = copy.copy(report)
        rest.progress = None
        return rest
    meaning = node_reports.app_node(job.state, report.state)
    if meaning.starts:
        transition(session, job, jobstate.RUNNING, f"started with replicas on {', '.join(sorted(nodes))}", events)
    if meaning.outcome is node_reports.Outcome.END_NODE:
        why = f"its replicas on {node} exited" + (f" with {report.exit_code}" if report.exit_code else "")
        app_replicas.end_node(session, job, node, why, events, release_reason=f"replicas on {node} exited")
    return None
