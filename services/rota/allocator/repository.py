"""The allocator's Postgres operations: dead nodes, the live view, commits of plan steps."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from rota.allocator.models import JobForecastRow, PlanStepRow
from rota.common import read_models, replicas
from rota.common.jobs_repo import Events, get_job, nodes_of, release, transition, unplace, utcnow
from rota.common.models import EPOCH_SEQUENCE, GpuClaimRow, GpuRow, JobArrayRow, JobRow, NodeRow, PlacementRow
from rota.core import dependencies, jobstate, nodestate
from rota.core.jobspec import JobSpecData, gpus_to_hold
from rota.core.planning.liveplan import LiveJob, LiveNode, Start
from rota.core.planning.moves import MoveCost, MoveInputs

PAUSE_EXIT_S = 1.0  # a paused job's process exit, after its state is copied out
SPEC_CACHE_SIZE = 4096  # distinct specs kept parsed


def holding_jobs(session: Session) -> list[JobRow]:
    return list(session.scalars(select(JobRow).where(JobRow.state.in_(jobstate.HOLDING_STATES))).all())


def commit_decision(session: Session, decision: Start, events: Events) -> JobRow | None:
    """Claims the GPUs under a new fencing epoch. None if the job is no longer pending.

    The claims' primary key makes a double booking fail the whole transaction.
    """
    job = get_job(session, decision.job_id, lock=True)
    if job is None or job.state != jobstate.PENDING:
        return None
    if replicas.is_app(job):  # a lease per node, each under its own epoch
        sets = dict(decision.replicas) or {decision.node: decision.gpus}
        epoch = max(lease.epoch for lease in replicas.place(session, job, sets, decision.node).values())
    else:
        epoch = _claim(session, job, decision)
    job.attempts += 1
    job.exit_code, job.error = None, ""
    where = f"on {decision.node} GPUs {list(decision.gpus)}"
    if len(decision.replicas) > 1:
        where = "with replicas on " + ", ".join(f"{n} GPUs {list(g)}" for n, g in decision.replicas)
    if decision.nodes:
        where = f"as a gang on {len(decision.nodes)} nodes ({', '.join(decision.nodes)}) x GPUs {list(decision.gpus)}"
    transition(session, job, jobstate.SCHEDULED, f"placed {where} (epoch {epoch})", events)
    session.flush()
    return job


GANG_PORT_BASE = 20000  # MASTER_PORT of a gang: ours, chosen per epoch in [base, base + span)
GANG_PORT_SPAN = 20000


def gang_master(session: Session, first_node: str, epoch: int) -> str:
    """host:port of a gang's rendezvous: node rank 0's host (its agent's advertised
    address), and a port that changes with every placement, so a restarted gang never
    meets a previous attempt's ranks; two gangs led from one host collide only when their
    epochs are GANG_PORT_SPAN apart, and then the rendezvous fails and the gang restarts."""
    address = session.scalar(select(NodeRow.address).where(NodeRow.name == first_node)) or "127.0.0.1:0"
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return f"{host}:{GANG_PORT_BASE + epoch % GANG_PORT_SPAN}"


def _claim(session: Session, job: JobRow, where: Start) -> int:
    """A new lease: a placement and one claim per GPU under a fresh epoch, which it returns."""
    epoch = int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
    nodes = list(where.nodes)  # a gang: every node of it, under the one epoch
    placement = PlacementRow(job_id=job.id, node=where.node, gpu_indices=list(where.gpus), epoch=epoch, gang_nodes=nodes)
    session.add(placement)
    session.flush()
    for node in nodes or [where.node]:
        for gpu in where.gpus:
            session.add(GpuClaimRow(node=node, gpu_index=gpu, job_id=job.id, placement_id=placement.id, epoch=epoch))
    job.node, job.gpu_indices, job.epoch = where.node, list(where.gpus), epoch
    job.gang_nodes = nodes
    job.gang_master = gang_master(session, where.node, epoch) if nodes else ""
    return epoch


# One statement for the whole queue; rows whose reason is unchanged are not rewritten.
SET_REASONS_SQL = text("""
UPDATE jobs SET reason = v.reason
FROM unnest(CAST(:ids AS text[]), CAST(:reasons AS text[])) AS v(id, reason)
WHERE jobs.id = v.id AND jobs.state = :pending AND jobs.reason IS DISTINCT FROM v.reason
""")


def set_waiting_reasons(session: Session, reasons: dict[str, str]) -> None:
    """Each waiting job's reason, written only where it changed, in one statement.

    With thousands queued (a burst of submissions) a statement per job would cost the
    plan a round trip each, and rewrite rows the api is inserting beside.
    """
    if reasons:
        session.execute(SET_REASONS_SQL, {"ids": list(reasons), "reasons": list(reasons.values()),
                                          "pending": jobstate.PENDING})


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


def live_view(session: Session, specs: SpecCache | None = None) -> LiveView:
    specs = SpecCache() if specs is None else specs
    nodes = session.scalars(select(NodeRow).where(NodeRow.health == nodestate.ALIVE).order_by(NodeRow.name)).all()
    gpu_counts: dict[str, int] = {}
    types: dict[str, dict[str, int]] = {}
    for gpu in session.scalars(select(GpuRow)):
        gpu_counts[gpu.node] = gpu_counts.get(gpu.node, 0) + 1
        count = types.setdefault(gpu.node, {})
        count[gpu.gpu_type] = count.get(gpu.gpu_type, 0) + 1
    now = utcnow()
    jobs: list[LiveJob] = []
    mappings: dict[str, dict[str, Any]] = {}
    running: dict[str, int] = {}
    for row in holding_jobs(session):
        if row.array_id:
            running[row.array_id] = running.get(row.array_id, 0) + 1
        if row.guest_of:  # in a host's bubbles: it holds no GPU of its own (guests_repo)
            continue
        spec, mappings[row.id] = specs.get(row.spec_hash, row.spec)
        jobs.append(live_job(row.id, row.tenant, row.kind, row.priority, spec, row.node, tuple(row.gpu_indices),
                             max(0.0, (now - (row.started_at or row.created_at)).total_seconds()),
                             tuple(row.gang_nodes), _replica_sets(row)))
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
    queue: list[dependencies.Queued] = []
    for job_id, tenant, kind, priority, digest, array_id in queued:
        spec, mappings[job_id] = specs.get(digest)
        jobs.append(live_job(job_id, tenant, kind, priority, spec, None, (), 0.0))
        if array_id or spec.depends_on:
            queue.append(dependencies.Queued(job_id, array_id or "", tuple((d["job"], d["when"]) for d in spec.depends_on)))
    bad = read_models.bad_gpus(session)
    return LiveView(
        [LiveNode(n.name, gpu_counts.get(n.name, 0), bad.get(n.name, ()), gpu_type=_node_type(types.get(n.name, {})),
                  switch=str((n.labels or {}).get("switch", ""))) for n in nodes],
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


def fail_unsatisfiable(session: Session, doomed: dict[str, str], events: Events) -> list[str]:
    """Waiting jobs whose dependency can no longer hold go FAILED with the reason; a job no
    longer PENDING is left as it is, so a repeated call (or a second leader's) changes nothing."""
    failed: list[str] = []
    for job_id in sorted(doomed):
        job = get_job(session, job_id, lock=True)
        if job is None or job.state != jobstate.PENDING:
            continue
        job.error = doomed[job_id]
        transition(session, job, jobstate.FAILED, doomed[job_id], events)
        failed.append(job_id)
    return failed


def _node_type(counts: dict[str, int]) -> str:
    """A node's GPU type: the one most of its GPUs have (a node holds one type in practice)."""
    return max(counts, key=lambda t: (counts[t], t)) if counts else ""


def _replica_sets(row: JobRow) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A realtime app's GPUs per node, home first (() for any other job)."""
    if not replicas.is_app(row):
        return ()
    sets = replicas.leases(row)
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
        gpu_memory_mb=spec.gpu_memory_mb,
    )


@dataclass(frozen=True)
class Resized:
    """A committed resize of one node of a realtime app: what that node's agent is told."""

    job: JobRow
    node: str
    gpus: tuple[int, ...]  # empty: the app left the node
    epoch: int  # the node's new lease (0 when it left)
    previous_epoch: int  # the node's lease before (0: the app was not there: a launch)


def commit_resize(session: Session, resize: Start, events: Events) -> Resized | None:
    """A realtime app's new GPU set on one node, under a new epoch for that node only; an
    empty set: it leaves the node; a node it is not on: it grows there. None if it moved on,
    the node is not live, or the app would be left without a replica.

    That node's lease closes and a new one opens, so the ledger bills each node's replicas
    for exactly the time they were held; the other nodes' leases are untouched.
    """
    job = get_job(session, resize.job_id, lock=True)
    if job is None or job.state not in jobstate.HOLDING_STATES or not replicas.is_app(job) or job.node is None:
        return None
    before = replicas.leases(job).get(resize.node)
    if before is None and not resize.gpus:
        return None  # it is not there to leave
    if before is None and session.scalar(
            select(NodeRow.health).where(NodeRow.name == resize.node)) != nodestate.ALIVE:
        return None
    lease = replicas.resize_node(session, job, resize.node, resize.gpus)
    if lease is None:
        return None
    events.add(job, "resized")
    session.flush()
    return Resized(job, resize.node, lease.gpus, lease.epoch, before.epoch if before else 0)


def record_plan_step(session: Session, **values: Any) -> PlanStepRow:
    epoch = int(session.execute(EPOCH_SEQUENCE.next_value()).scalar_one())
    row = PlanStepRow(epoch=epoch, **values)
    session.add(row)
    session.flush()
    return row


def prune_plan_steps(session: Session, older_than_s: float, batch: int) -> int:
    """Deletes up to `batch` plan steps created more than `older_than_s` ago, oldest first,
    never the newest (CurrentPlan shows it however old it is); returns how many went."""
    newest = select(func.max(PlanStepRow.id)).scalar_subquery()
    doomed = (
        select(PlanStepRow.id)
        .where(PlanStepRow.created_at < func.now() - timedelta(seconds=older_than_s), PlanStepRow.id < newest)
        .order_by(PlanStepRow.id)
        .limit(batch)
    )
    result = session.execute(delete(PlanStepRow).where(PlanStepRow.id.in_(doomed)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def latest_plan_step(session: Session) -> PlanStepRow | None:
    return session.scalars(select(PlanStepRow).order_by(PlanStepRow.id.desc()).limit(1)).first()


def yield_lease(session: Session, job_id: str, reason: str, events: Events) -> tuple[list[str], int] | None:
    """A running job gives its GPUs back and waits again (docs/design.md §4 lease expiry).

    Returns (nodes, epoch) to stop it at (a gang's every node), or None if it no longer holds GPUs. Only jobs that
    restart on failure are asked to yield, so requeueing them loses no more than a restart.
    """
    job = get_job(session, job_id, lock=True)
    if job is None or job.state not in jobstate.HOLDING_STATES or job.node is None:
        return None
    nodes, epoch = nodes_of(job), job.epoch
    release(session, job, "lease yielded")
    transition(session, job, jobstate.PENDING, reason, events)
    unplace(job)
    return nodes, epoch


# One statement whatever the number of jobs (arrays, not a VALUES row per job): its text,
# and so its parsing and planning, is the same for 1 or 2,000 forecasts.
SAVE_FORECASTS_SQL = text("""
INSERT INTO job_forecasts (job_id, planned_seconds, declared_seconds, model, p50_seconds, p90_seconds)
SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:planned AS float8[]), CAST(:declared AS float8[]),
                     CAST(:models AS text[]), CAST(:p50 AS float8[]), CAST(:p90 AS float8[]))
ON CONFLICT (job_id) DO UPDATE SET planned_seconds = excluded.planned_seconds,
    declared_seconds = excluded.declared_seconds, model = excluded.model,
    p50_seconds = excluded.p50_seconds, p90_seconds = excluded.p90_seconds, updated_at = now()
""")


def save_forecasts(session: Session, forecasts: dict[str, dict[str, Any]]) -> None:
    """What each job was planned on, for `rota job` (predicted beside actual duration)."""
    if not forecasts:
        return
    values = list(forecasts.values())
    session.execute(SAVE_FORECASTS_SQL, {
        "job_ids": list(forecasts), "planned": [fc.get("planned_seconds") for fc in values],
        "declared": [fc.get("declared_seconds") for fc in values], "models": [fc["model"] for fc in values],
        "p50": [fc.get("p50_seconds", 0.0) for fc in values], "p90": [fc.get("p90_seconds", 0.0) for fc in values],
    })


def job_forecast(session: Session, job_id: str) -> JobForecastRow | None:
    return session.get(JobForecastRow, job_id)


def move_inputs(session: Session, movable: Sequence[str]) -> MoveInputs:
    """What the planner needs to move jobs: the measured costs of the `movable` jobs (those
    with a complete image; see rota.checkpoint) and the node each pending job asked for."""
    costs: dict[str, MoveCost] = {}
    for job_id, c in read_models.checkpoint_costs(session, movable).items():
        # Never paused yet: its last checkpoint's copy time plus an exit stands in for a pause.
        pause_s = c.pause_s if c.pauses else c.copy_s + PAUSE_EXIT_S
        # Restoring reads back what the write stored, through the same chunk store.
        costs[job_id] = MoveCost(pause_s=pause_s, restore_s=c.write_s)
    return MoveInputs(costs=costs, targets=read_models.pending_resume_targets(session))
