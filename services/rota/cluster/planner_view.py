"""The allocator's snapshot of the cluster state: live nodes, holding jobs, the queue."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rota.cluster import app_replicas
from rota.cluster.job_lifecycle import (
    utcnow,
)
from rota.cluster.models import (
    GpuClaimRow,
    GpuRow,
    JobArrayRow,
    JobRow,
    NodeRow,
)
from rota.common import read_models
from rota.core import dependencies, jobstate, nodestate
from rota.core.jobspec import JobSpecData, gpus_to_hold, memory_bytes
from rota.core.planning.liveplan import LiveJob, LiveNode

SPEC_CACHE_SIZE = 4096  # distinct specs kept parsed


def holding_jobs(session: Session) -> list[JobRow]:
    return list(session.scalars(select(JobRow).where(JobRow.state.in_(jobstate.HOLDING_STATES))).all())


@dataclass
class LiveView:
    """What the planner needs: live nodes, holding jobs, then the queue in arrival order."""

    nodes: list[LiveNode]
    jobs: list[LiveJob]
    addresses: dict[str, str]
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What rota.core.dependencies.gate reads: the queue with each job's array and
    # parents, the parents' states, each array's tasks holding GPUs and its cap.
    queue: list[dependencies.Queued] = field(default_factory=list)
    parent_states: dict[str, str] = field(default_factory=dict)
    array_running: dict[str, int] = field(default_factory=dict)
    array_caps: dict[str, int] = field(default_factory=dict)

    def gate(self) -> dependencies.Gate:
        return dependencies.gate(self.queue, self.parent_states, self.array_running, self.array_caps)

    def fingerprint(self) -> tuple[frozenset[tuple[str, int, tuple[int, ...], str, str]], frozenset[tuple[str, str | None]]]:
        """Changes exactly on an arrival, a completion, a placement or a node change (a GPU
        marked bad or cleared is one)."""
        return (frozenset((n.name, n.gpus, n.bad_gpus, n.gpu_type, n.switch) for n in self.nodes),
                frozenset((j.id, j.node) for j in self.jobs))


class SpecCache:
    """Parsed job specs by digest (jobs.spec_hash, the api's SHA-256 of the stored body).

    The live view is read every cycle; with thousands queued, parsing each spec again was
    much of a plan's cost. A burst of submissions is mostly a few specs, so the queue's
    rows are read without their specs and only an unseen digest's spec is fetched.
    """

    def __init__(self, size: int = SPEC_CACHE_SIZE) -> None:
        self._size = size
        self._specs: OrderedDict[str, tuple[JobSpecData, dict[str, Any]]] = OrderedDict()

    def __contains__(self, digest: str) -> bool:
        return digest in self._specs

    def get(self, digest: str, raw: dict[str, Any] | None = None) -> tuple[JobSpecData, dict[str, Any]]:
        """The parsed spec and its mapping (shared: read-only), parsing `raw` if unseen."""
        found = self._specs.get(digest)
        if found is not None:
            self._specs.move_to_end(digest)
            return found
        if raw is None:
            raise KeyError(digest)
        found = (JobSpecData.from_dict(raw), dict(raw))
        self._specs[digest] = found
        if len(self._specs) > self._size:
            self._specs.popitem(last=False)
        return found


def _gpus_by_node(session: Session) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Each node's GPU count, and its count per GPU type."""
    gpu_counts: dict[str, int] = {}
    types: dict[str, dict[str, int]] = {}
    for gpu in session.scalars(select(GpuRow)):
        gpu_counts[gpu.node] = gpu_counts.get(gpu.node, 0) + 1
        count = types.setdefault(gpu.node, {})
        count[gpu.gpu_type] = count.get(gpu.gpu_type, 0) + 1
    return gpu_counts, types


def _holding(session: Session, specs: SpecCache, mappings: dict[str, dict[str, Any]]) -> tuple[list[LiveJob], dict[str, int]]:
    """The jobs holding GPUs (guests aside), their spec mappings into `mappings`, and each
    array's tasks holding GPUs."""
    now = utcnow()
    jobs: list[LiveJob] = []
    running: dict[str, int] = {}
    for row in holding_jobs(session):
        if row.array_id:
            running[row.array_id] = running.get(row.array_id, 0) + 1
        if row.guest_of:  # in a host's bubbles: it holds no GPU of its own (guest_leases)
            continue
        spec, mappings[row.id] = specs.get(row.spec_hash, row.spec)
        jobs.append(live_job(row.id, row.tenant, row.kind, row.priority, spec, row.node, tuple(row.gpu_indices),
                             max(0.0, (now - (row.started_at or row.created_at)).total_seconds()),
                             tuple(row.gang_nodes), _replica_sets(row)))
    return jobs, running


def _stopping_claims(session: Session) -> tuple[dict[str, set[int]], set[str]]:
    """A stopped gang whose ranks still run on some node keeps its GPUs there claimed: it is
    not placed again before they stop, and nothing else is placed on those GPUs. The claimed
    GPUs per node, and the jobs held back."""
    stopping: dict[str, set[int]] = {}
    held_back: set[str] = set()
    for node, index, job_id in session.execute(
            select(GpuClaimRow.node, GpuClaimRow.gpu_index, GpuClaimRow.job_id)
            .join(JobRow, JobRow.id == GpuClaimRow.job_id).where(JobRow.state.notin_(jobstate.HOLDING_STATES))):
        stopping.setdefault(node, set()).add(index)
        held_back.add(job_id)
    return stopping, held_back


def live_view(session: Session, specs: SpecCache | None = None) -> LiveView:
    specs = SpecCache() if specs is None else specs
    nodes = session.scalars(select(NodeRow).where(NodeRow.health == nodestate.ALIVE).order_by(NodeRow.name)).all()
    gpu_counts, types = _gpus_by_node(session)
    mappings: dict[str, dict[str, Any]] = {}
    jobs, running = _holding(session, specs, mappings)
    # The queue in arrival order, as plain columns (no ORM objects, no specs) ...
    # (An array's tasks share one creation time: they queue in index order.)
    queued = session.execute(
        select(JobRow.id, JobRow.tenant, JobRow.kind, JobRow.priority, JobRow.spec_hash, JobRow.array_id)
        .where(JobRow.state == jobstate.PENDING).order_by(JobRow.created_at, JobRow.array_index, JobRow.id)
    ).all()
    # ... and the spec of each digest not seen before, from one job that has it.
    unseen = {digest: job_id for job_id, _, _, _, digest, _ in queued if digest not in specs}
    if unseen:
        for digest, raw in session.execute(select(JobRow.spec_hash, JobRow.spec).where(JobRow.id.in_(list(unseen.values())))):
            specs.get(digest, raw)
    stopping, held_back = _stopping_claims(session)
    queue: list[dependencies.Queued] = []
    for job_id, tenant, kind, priority, digest, array_id in queued:
        if job_id in held_back:
            continue
        spec, mappings[job_id] = specs.get(digest)
        jobs.append(live_job(job_id, tenant, kind, priority, spec, None, (), 0.0))
        if array_id or spec.depends_on:
            queue.append(dependencies.Queued(job_id, array_id or "", tuple((d["job"], d["when"]) for d in spec.depends_on)))
    bad = read_models.bad_gpus(session)
    return LiveView(
        [LiveNode(n.name, gpu_counts.get(n.name, 0), tuple(sorted({*bad.get(n.name, ()), *stopping.get(n.name, ())})),
                  gpu_type=_node_type(types.get(n.name, {})),
                  switch=str((n.labels or {}).get("switch", "")), cpus=n.cpus, memory_bytes=n.memory_bytes)
         for n in nodes],
        jobs, {n.name: n.address for n in nodes}, mappings,
        queue, parent_states(session, {p for q in queue for p, _ in q.depends_on}), running,
        array_caps(session, {q.array_id for q in queue if q.array_id}),
    )


def parent_states(session: Session, parents: set[str]) -> dict[str, str]:
    """Each parent's state: a job's own, an array's from its tasks (dependencies.array_state);
    a parent that is gone is absent."""
    if not parents:
        return {}
    wanted = sorted(parents)
    states = dict(session.execute(select(JobRow.id, JobRow.state).where(JobRow.id.in_(wanted))).all())
    counts: dict[str, dict[str, int]] = {}
    stmt = (select(JobRow.array_id, JobRow.state, func.count()).where(JobRow.array_id.in_(wanted))
            .group_by(JobRow.array_id, JobRow.state))
    for array_id, state, n in session.execute(stmt):
        counts.setdefault(str(array_id), {})[state] = int(n)
    states.update({a: dependencies.array_state(c) for a, c in counts.items()})
    return states


def array_caps(session: Session, array_ids: set[str]) -> dict[str, int]:
    """The cap (%K) of each capped array among `array_ids`."""
    if not array_ids:
        return {}
    stmt = select(JobArrayRow.id, JobArrayRow.max_running).where(
        JobArrayRow.id.in_(sorted(array_ids)), JobArrayRow.max_running > 0)
    return dict(session.execute(stmt).all())


def _node_type(counts: dict[str, int]) -> str:
    """A node's GPU type: the one most of its GPUs have (a node holds one type in practice)."""
    return max(counts, key=lambda t: (counts[t], t)) if counts else ""


def _replica_sets(row: JobRow) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A realtime app's GPUs per node, home first (() for any other job)."""
    if not app_replicas.is_app(row):
        return ()
    sets = app_replicas.leases(row)
    return tuple((n, sets[n].gpus) for n in sorted(sets, key=lambda n: (n != row.node, n)))


def live_job(job_id: str, tenant: str, kind: str, priority: int, spec: JobSpecData, node: str | None = None,
             gpu_indices: tuple[int, ...] = (), elapsed_s: float = 0.0, gang_nodes: tuple[str, ...] = (),
             replica_sets: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> LiveJob:
    """A job as the planner sees it, from its row's columns and its parsed spec."""
    return LiveJob(
        id=job_id, tenant=tenant, kind=kind, priority=priority, gpus=gpus_to_hold(spec), node=node,
        gpu_indices=gpu_indices, elapsed_s=elapsed_s, duration_s=spec.duration_seconds, demand=tuple(spec.demand),
        max_swap=spec.max_swap, preemptible=spec.preemptible, restart=spec.restart,
        nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, gang_nodes=gang_nodes,
        gpu_types=tuple(spec.gpu_types), same_switch=spec.same_switch, replicas=replica_sets,
        gpu_memory_mb=spec.gpu_memory_mb, cpus=spec.cpus or 0.0, memory_bytes=memory_bytes(spec),
    )
