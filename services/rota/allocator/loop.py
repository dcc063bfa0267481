"""The scheduling loop: the rolling-horizon planner driving the live cluster (docs/design.md §3).

Only the leader runs cycles: it holds a Postgres advisory lock on a dedicated connection,
so a second allocator (or a crashed one's replacement) waits instead of double-booking;
and every placement is committed with a fresh fencing epoch before any agent hears of it.

A cycle re-plans the whole horizon when something changed (an arrival, a completion, a
node change), when a new step begins, and on the full-mode timer; it commits step 0 only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
from sqlalchemy import Connection, Engine, text

from rota.allocator import metrics as allocator_metrics
from rota.allocator import repository
from rota.allocator.forecasts import Forecast
from rota.allocator.guest_placement import GuestPlacement
from rota.allocator.peers import Peers
from rota.allocator.wakeups import Wakeups
from rota.cluster import job_protos, job_starts, node_lifecycle, planner_view
from rota.cluster.job_lifecycle import Events, get_job
from rota.common import metrics, read_models
from rota.common.agents import AgentClients
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState
from rota.common.quotas import tenant_quotas
from rota.core.errors import Unavailable
from rota.core.fairness.ltgf import FairnessConfig
from rota.core.planning.liveplan import Horizon, LiveJob, LiveScenario, Start, StepDecision
from rota.core.planning.moves import MoveInputs, Preemption
from rota.core.planning.planner import PlanOutcome, plan_live
from rota.core.planning.policy_fair import Yield
from rota.v1 import agent_pb2

log = logging.getLogger(__name__)
LEADER_LOCK_KEY = 0x526F7461  # "Rota"
PLAN_BUDGET = 5  # re-plans on events wait this many times the last plan's CPU time
# Plan steps past their retention are deleted this often, at most this many at a time (an
# allocator that was down for long catches up over a few minutes, never in one long delete).
PRUNE_INTERVAL_S = 60.0
PRUNE_BATCH = 5000
# Woken cycles (work arrived) come at most this often, and not during a costly plan's rest.
MIN_CYCLE_GAP_S = 0.1
# A dead node's jobs are stopped there before they are placed again (a partitioned node
# still runs them): the cycle waits this long at most for the node's agent to answer.
STRANDED_STOP_DEADLINE_S = 2.0
STRANDED_GRACE_S = 0.5


class Leadership:
    """Session-level advisory lock: released by Postgres when our connection dies."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None
        self.db_errors = 0  # how often the database could not be reached

    def ensure(self) -> bool:
        try:
            if self._conn is not None:
                self._conn.execute(text("SELECT 1"))
                self._conn.commit()
                return True
            conn = self._engine.connect()
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}).scalar_one())
            conn.commit()
            if not got:
                conn.close()
                return False
            self._conn = conn
            log.info("allocator is now the leader")
            return True
        except Exception as exc:  # noqa: BLE001 - losing the connection means losing the lead
            log.warning("leadership check failed: %s", exc)
            self.db_errors += 1
            self.release()
            return False

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._conn = None


@dataclass
class CycleReport:
    placed: int = 0
    resized: int = 0
    waiting: int = 0
    dead_nodes: int = 0
    led: bool = False
    planned: str = ""  # the trigger of this cycle's re-plan; "" when nothing changed
    moved: list[str] = field(default_factory=list)  # started jobs this cycle began to move
    pruned: int = 0  # plan steps deleted past their retention


@dataclass
class _Planned:
    """What a cycle's step 4 planned on, and its outcome."""

    jobs: list[LiveJob]
    forecasts: dict[str, Forecast]
    held_back: dict[str, str]
    moves: MoveInputs
    outcome: PlanOutcome


@dataclass
class _Memory:
    """What the last committed plan assumed, to tell when the cluster moved on."""

    fingerprint: Any = None
    step_index: int = -1
    last_full: float = field(default_factory=time.time)
    # Jobs that yielded a lease or were preempted -> the job they made room for: once
    # requeued, they wait until it has started.
    yielded_to: dict[str, str] = field(default_factory=dict)
    # Heartbeats could not be recorded while the database was unreachable: after it
    # returns, no node is declared dead before a full node timeout has passed.
    planned_at: float = 0.0  # monotonic time of the last plan, and the CPU it cost
    plan_cost_s: float = 0.0
    seen_db_errors: int = 0
    no_deaths_until: float = 0.0
    # What job_forecasts already holds, so a re-plan writes only what changed.
    saved_forecasts: dict[str, Forecast] = field(default_factory=dict)
    pruned_at: float = float("-inf")  # clock time of the last plan-step pruning


class SchedulingLoop:
    def __init__(
        self, settings: Settings, db: Database, live: LiveState, agents: AgentClients, peers: Peers,
        clock: Callable[[], float] = time.time, wakeups: Wakeups | None = None,
    ) -> None:
        self.settings = settings
        self.wakeups = wakeups
        self.db = db
        self.live = live
        self.agents = agents
        self.clock = clock
        self.leadership = Leadership(db.engine)
        self.memory = _Memory(last_full=clock())
        self.specs = planner_view.SpecCache()
        self._agent_calls: set[asyncio.Task[None]] = set()
        self.peers = peers
        self.forecasts = peers.forecasts
        self.mover = peers.mover
        self.guests = GuestPlacement(db)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.cycle()
            except Unavailable as exc:
                log.warning("cycle skipped: %s", exc)
                self.leadership.db_errors += 1
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad cycle
                log.exception("scheduling cycle failed")
            await self._pause()

    async def _pause(self) -> None:
        """Until the next cycle: the interval, or sooner when the api wakes the loop (work
        arrived), though not within MIN_CYCLE_GAP_S of the last cycle nor during the rest
        after a costly plan, which a burst of arrivals would otherwise cut short."""
        interval = self.settings.schedule_interval_s
        if self.wakeups is None:
            await asyncio.sleep(interval)
            return
        ended = time.monotonic()
        if not await self.wakeups.wait(interval):
            return
        rest_ends = self.memory.planned_at + PLAN_BUDGET * self.memory.plan_cost_s
        resume_at = min(max(ended + MIN_CYCLE_GAP_S, rest_ends), ended + interval)
        await asyncio.sleep(max(0.0, resume_at - time.monotonic()))

    async def cycle(self, *, force_full: bool = False) -> CycleReport:
        report = CycleReport()
        # 1. Lead, or wait for the leader's lock to be released.
        if not await asyncio.to_thread(self.leadership.ensure):
            self.memory.fingerprint = None  # a new leader re-plans from scratch
            metrics.LEADER.set(0)
            return report
        report.led = True
        metrics.LEADER.set(1)
        report.pruned = await self._prune_history()  # housekeeping: old plan steps, once a minute
        events = Events()
        # 2. Nodes silent past the timeout are dead; their jobs lost and handled.
        report.dead_nodes = await self._declare_dead(events)
        #    Guests whose host ended (or lost its GPUs) take the GPUs over, before any plan
        #    can give them away.
        await asyncio.to_thread(self.guests.take_over, events)
        # 3. The snapshot, and whether anything calls for a new plan. Resting after a costly
        #    plan (a burst of arrivals), not even the snapshot is read: with thousands
        #    queued, reading it is much of a plan's cost.
        horizon = Horizon(self.settings.plan_step_s, self.settings.plan_horizon, self.clock())
        if self._resting(horizon, force_full):
            await self._guests_between_plans(events)
            return report
        began = time.process_time()
        view = await asyncio.to_thread(self.db.run, lambda s: planner_view.live_view(s, self.specs))
        policy, trigger = self._trigger(view, horizon, force_full)
        if trigger is None:
            await self._guests_between_plans(events)
            return report
        # 4. The pure core plans the horizon on the forecaster's durations and curves.
        planned = await self._plan(view, horizon, policy, events)
        outcome = planned.outcome
        # 5. Commit step 0: starts and resizes, each in its own transaction under a new epoch.
        launches, resizes, leaving = await self._commit(outcome, view.addresses, events)
        started = {r.job.id for _, r in launches} - {r.job_id for r in outcome.decision.resizes}
        #    Trials the plan could not start on free GPUs go into running pipelines' bubbles.
        guests = await asyncio.to_thread(self.guests.after_plan, planned.jobs, started, planned.held_back, events)
        placed_guests = {r.job.id for _, r in guests}
        for job_id in placed_guests:
            outcome.decision.waiting.pop(job_id, None)
        launches += guests
        report.placed, report.resized = len(started), len(resizes) + len(leaving)
        report.waiting = len(outcome.decision.waiting)
        report.planned = trigger
        allocator_metrics.record_plan(outcome, trigger)
        await self._save_plan(outcome, trigger, horizon, planned.forecasts)
        self._remember_plan(view, outcome, started, placed_guests, horizon, policy, began)
        # 6. After the commits: refresh the cache, publish events, tell the agents.
        await asyncio.to_thread(self._refresh_cache, events)
        self._tell_agents(launches, resizes, leaving)
        # 7. Moves of started jobs through the checkpoint coordinator.
        report.moved += await self._move_started(outcome, planned.moves, view.addresses)
        return report

    async def _declare_dead(self, events: Events) -> int:
        """Step 2: nodes silent past the timeout are dead; their jobs lost and handled. Only
        while the api (which receives heartbeats) is up and the database has been reachable
        for a node timeout: neither outage may read as deaths. The number declared dead."""
        if self.leadership.db_errors != self.memory.seen_db_errors:
            self.memory.seen_db_errors = self.leadership.db_errors
            self.memory.no_deaths_until = self.clock() + self.settings.node_timeout_s
        if self.clock() < self.memory.no_deaths_until or not await self.peers.api.serving():
            return 0
        dead = await asyncio.to_thread(
            self.db.run, lambda s: node_lifecycle.declare_dead_nodes(s, self.settings.node_timeout_s, events)
        )
        # A silent node may only be cut off from the api and still run its jobs: stop
        # them there (where it can still be dialled) before the plan places them again.
        await self._stop_stranded(dead)
        return len(dead)

    async def _plan(self, view: planner_view.LiveView, horizon: Horizon, policy: str, events: Events) -> _Planned:
        """Step 4: the pure core plans the horizon (in a thread: full mode takes seconds) on the
        forecaster's durations and curves; `fair` first reads the ledger's standings, and so
        does `fast` when jobs of more than one tenant wait (it interleaves them by standing)."""
        jobs, forecasts = await self.forecasts.apply(view.jobs, view.specs, horizon)
        fair = await self.peers.ledger.fair_inputs(self._fairness_config(), _held_by_tenant(view.jobs)) \
            if policy == "fair" or (policy == "fast" and _tenants_waiting(view.jobs) > 1) else None
        # Array caps (%K) and dependencies hold jobs back, each with its reason; a job whose
        # dependency can no longer hold fails here, the one writer of what the plan decides.
        gate = view.gate()
        if gate.doomed:
            await asyncio.to_thread(self.db.run, lambda s: job_starts.fail_unsatisfiable(s, gate.doomed, events))
        held_back = {**self._held_back(view), **gate.held_back, **gate.doomed}
        moves = await asyncio.to_thread(self.db.run, lambda s: self._move_inputs(s, view))
        quotas = await asyncio.to_thread(self.db.run, tenant_quotas)
        outcome = await asyncio.to_thread(
            plan_live, view.nodes, jobs, horizon, policy, self.settings.full_time_limit_s, fair, held_back, moves,
            {t: q for t, q in quotas.items() if q.configured or q.parent} or None,
        )
        return _Planned(jobs, forecasts, held_back, moves, outcome)

    async def _save_plan(self, outcome: PlanOutcome, trigger: str, horizon: Horizon,
                         forecasts: dict[str, Forecast]) -> None:
        """The waiting reasons, the plan and the forecasts that changed since the last plan."""
        await asyncio.to_thread(self.db.run, lambda s: job_starts.set_waiting_reasons(s, outcome.decision.waiting))
        changed = {k: v for k, v in forecasts.items() if self.memory.saved_forecasts.get(k) != v}
        await asyncio.to_thread(self.db.run, lambda s: self._record(s, outcome, trigger, horizon, forecasts, changed))
        self.memory.saved_forecasts = forecasts

    def _remember_plan(self, view: planner_view.LiveView, outcome: PlanOutcome, started: set[str],
                       placed_guests: set[str], horizon: Horizon, policy: str, began: float) -> None:
        # The plan's cost: this process's CPU for the snapshot, planning and its writes. CPU,
        # not elapsed time: the rest exists to leave the cores to the api under a burst, and
        # waits (commits under load, the forecaster) cost none; on a busy machine a two-job
        # plan took long enough to rest for seconds and leave new arrivals without a plan.
        # A plan that moves jobs frees GPUs for the next one to fill: that one does not wait.
        moving = bool(outcome.yields or outcome.preemption or outcome.migrations or outcome.reclaims)
        self.memory.planned_at = time.monotonic()
        self.memory.plan_cost_s = 0.0 if moving else time.process_time() - began
        self.memory.fingerprint = _expected_fingerprint(view, outcome.decision, started, placed_guests)
        self.memory.step_index = horizon.step_index
        if policy == "full":
            self.memory.last_full = self.clock()

    def _tell_agents(self, launches: list[tuple[str, agent_pb2.LaunchRequest]],
                     resizes: list[tuple[str, agent_pb2.ResizeRequest]], leaving: list[tuple[str, str, int]]) -> None:
        """Step 6: tell the agents, in the background: a frozen agent must not hold the loop
        for a call's deadline, when no node could be declared dead; a call that fails is
        retried by reconciliation."""
        for address, request in launches:
            self._to_agent(self._launch(address, request))
        for address, resize in resizes:
            self._to_agent(self._resize(address, resize))
        for address, job_id, epoch in leaving:  # a realtime app's replicas leaving a node
            self._to_agent(self._stop(address, job_id, epoch, "the app's replicas left this node"))

    async def _move_started(self, outcome: PlanOutcome, moves: MoveInputs, addresses: dict[str, str]) -> list[str]:
        """Step 7: moves of started jobs through the checkpoint coordinator, in the background:
        lease yields (`fair`), a priced preemption (`fast`, `full`), fragmentation repair.
        The next cycle sees the paused job's GPUs free and plans into them. The jobs moved."""
        moved: list[str] = []
        for r in outcome.reclaims:  # a tenant's guarantee: its borrowers are paused (checkpointed)
            if await self._reclaim(r, addresses):
                moved.append(r.job_id)
        for y in outcome.yields:
            await self._yield(y, moves, addresses)
        if outcome.preemption is not None:
            p = outcome.preemption
            if self.mover.start(p.job_id, reason=p.reason):
                metrics.PREEMPTIONS.inc()
                self.memory.yielded_to[p.job_id] = p.for_job
                moved.append(p.job_id)
        for m in outcome.migrations:
            if self.mover.start(m.job_id, target=m.to_node, reason=f"{m.reason} (from {m.from_node} to {m.to_node})"):
                metrics.MIGRATIONS.inc()
                self.memory.yielded_to[m.job_id] = m.for_job  # not back into the block it freed
                moved.append(m.job_id)
        return moved

    async def _guests_between_plans(self, events: Events) -> None:
        """A cycle without a plan: trials still waiting may go into bubbles opened since the
        last plan; the cache is refreshed and the events published either way."""
        guests = await asyncio.to_thread(self.guests.between_plans, events)
        placed = {r.job.id for _, r in guests}
        if placed and self.memory.fingerprint is not None:  # leaving the view is no change to re-plan for
            nodes, jobs = self.memory.fingerprint
            self.memory.fingerprint = nodes, frozenset(j for j in jobs if j[0] not in placed)
        await asyncio.to_thread(self._refresh_cache, events)
        for address, request in guests:
            self._to_agent(self._launch(address, request))

    async def _prune_history(self) -> int:
        """Housekeeping of the leader, once per PRUNE_INTERVAL_S: old plan steps go."""
        now = self.clock()
        if now - self.memory.pruned_at < PRUNE_INTERVAL_S:
            return 0
        self.memory.pruned_at = now
        retention = self.settings.plan_retention_s
        return await asyncio.to_thread(self.db.run, lambda s: repository.prune_plan_steps(s, retention, PRUNE_BATCH))

    def _move_inputs(self, session, view: planner_view.LiveView) -> MoveInputs:  # type: ignore[no-untyped-def]
        # Without a checkpoint service nothing can be paused: no costs, so no moves; the
        # nodes that resumed jobs asked for still hold.
        # A gang pauses as one (every rank of every node, or none) when it yields a lease;
        # the priced moves never pick one (moves.py): its whole block would have to move.
        movable = [j.id for j in view.jobs if j.node is not None and j.preemptible and not j.realtime]
        found = repository.move_inputs(session, movable if self.mover.available else [])
        return MoveInputs(costs=found.costs, targets=found.targets, busy=self.mover.busy(),
                          yielded_to=dict(self.memory.yielded_to))

    async def _reclaim(self, r: Preemption, addresses: dict[str, str]) -> bool:
        """A borrower paused for a tenant's guarantee; stopped and requeued instead when the
        pause is refused, so the reclaim bound (docs/tenants.md) holds either way."""
        as_yield = Yield(r.job_id, "", int(r.gain), r.for_job, "", r.reason)  # what _yield_by_stop reads

        async def stop_instead(why: str) -> None:
            await self._yield_by_stop(as_yield, f"{r.reason} (restarted: pausing was refused: {why})", addresses)

        if not self.mover.start(r.job_id, reason=r.reason, on_refused=stop_instead):
            return False
        metrics.QUOTA_RECLAIMS.inc()
        self.memory.yielded_to[r.job_id] = r.for_job
        return True

    async def _yield(self, y: Yield, moves: MoveInputs, addresses: dict[str, str]) -> None:
        """A lease yield: paused when the job has an image, else stopped and requeued."""
        reason = f"yielded its GPUs to {y.to_job} ({y.to_tenant}): {y.reason}"

        async def stop_instead(why: str) -> None:
            await self._yield_by_stop(y, f"{reason} (restarted: pausing was refused: {why})", addresses)

        if y.job_id in moves.costs and self.mover.start(y.job_id, reason=reason, on_refused=stop_instead):
            self.memory.yielded_to[y.job_id] = y.to_job
            metrics.LEASE_YIELDS.labels(how="paused").inc()
            return
        await self._yield_by_stop(y, reason, addresses)

    async def _yield_by_stop(self, y: Yield, reason: str, addresses: dict[str, str]) -> None:
        events = Events()
        held = await asyncio.to_thread(self.db.run, lambda s: job_starts.yield_lease(s, y.job_id, reason, events))
        if held is None:
            return
        metrics.LEASE_YIELDS.labels(how="stopped").inc()
        self.memory.yielded_to[y.job_id] = y.to_job
        await asyncio.to_thread(self._publish, events)
        for node in held[0]:
            if node in addresses:
                self._to_agent(self._stop(addresses[node], y.job_id, held[1], reason))

    def _to_agent(self, call: Coroutine[Any, Any, None]) -> None:
        """An agent call that the cycle does not wait for (kept referenced until done)."""
        task = asyncio.create_task(call)
        self._agent_calls.add(task)
        task.add_done_callback(self._agent_calls.discard)

    def _held_back(self, view: planner_view.LiveView) -> dict[str, str]:
        """Yielded jobs stay out of the plan until the job they yielded to has GPUs (or is gone)."""
        queued = {j.id for j in view.jobs if j.node is None}
        # Kept while the job it made room for waits (the moved job may still be PAUSED).
        self.memory.yielded_to = {y: to for y, to in self.memory.yielded_to.items() if to in queued}
        return {y: f"waiting: yielded its lease to {to}; queued again once {to} has started"
                for y, to in self.memory.yielded_to.items()}

    def _full_due(self, force_full: bool) -> bool:
        s = self.settings
        return force_full or (s.full_interval_s > 0 and self.clock() - self.memory.last_full >= s.full_interval_s)

    def _resting(self, horizon: Horizon, force_full: bool) -> bool:
        """Under a burst of arrivals, planning (with its reads and writes) gets at most
        1/(1 + PLAN_BUDGET) of a core: one plan then covers every event since the last.
        A full re-plan, a new step or a new leader does not wait."""
        if self.memory.fingerprint is None or self._full_due(force_full):
            return False
        if horizon.step_index != self.memory.step_index:
            return False
        return time.monotonic() - self.memory.planned_at < PLAN_BUDGET * self.memory.plan_cost_s

    def _trigger(self, view: planner_view.LiveView, horizon: Horizon, force_full: bool) -> tuple[str, str | None]:
        s = self.settings
        if self._full_due(force_full):
            return "full", "full re-plan (timer)"
        fingerprint = view.fingerprint()
        if self.memory.fingerprint is None:
            return s.policy, "first plan of this leader"
        if fingerprint != self.memory.fingerprint:
            return s.policy, _what_changed(self.memory.fingerprint, fingerprint)
        if horizon.step_index != self.memory.step_index:
            return s.policy, allocator_metrics.step_trigger(horizon.step_index, horizon.step_s)
        return s.policy, None

    async def _commit(
        self, outcome: PlanOutcome, addresses: dict[str, str], events: Events
    ) -> tuple[list[tuple[str, agent_pb2.LaunchRequest]], list[tuple[str, agent_pb2.ResizeRequest]],
               list[tuple[str, str, int]]]:
        """Resizes first (a realtime app's replicas that shrink free GPUs a start may take
        in the same step), then starts; each in its own transaction under new epochs."""
        launches: list[tuple[str, agent_pb2.LaunchRequest]] = []
        resizes: list[tuple[str, agent_pb2.ResizeRequest]] = []
        leaving: list[tuple[str, str, int]] = []
        for resize in outcome.decision.resizes:
            done = await asyncio.to_thread(self.db.run, lambda s, r=resize: _commit_resize(s, r, events))
            if done is None:
                continue
            request, address = done[1], addresses.get(resize.node)
            if address is None:  # a node no longer live: its heartbeat's reconciliation stops the replicas
                continue
            if isinstance(request, agent_pb2.LaunchRequest):
                launches.append((address, request))
            elif isinstance(request, agent_pb2.ResizeRequest):
                resizes.append((address, request))
            else:
                leaving.append((address, resize.job_id, request))
        for start in outcome.decision.starts:
            placed = start.nodes or tuple(n for n, _ in start.replicas) or (start.node,)
            for node in placed:  # a gang: every node launches its rank group; an app: its replicas there
                launch = await asyncio.to_thread(
                    self.db.run, lambda s, d=start, n=node: self._commit_start(s, d, events, n))
                if launch is None:
                    break
                launches.append((addresses[node], launch))
        return launches, resizes, leaving

    @staticmethod
    def _commit_start(session, decision, events: Events, node: str | None = None) -> agent_pb2.LaunchRequest | None:  # type: ignore[no-untyped-def]
        """Commits the start (on its first node), then each node's launch request."""
        node = decision.node if node is None else node
        if node == decision.node:
            job = job_starts.commit_decision(session, decision, events)
        else:
            job = get_job(session, decision.job_id)
            job = job if job is not None and job.state == "SCHEDULED" else None
        if job is None:
            return None
        # A paused, migrated or requeued job continues from its last checkpoint image.
        message = job_protos.job_on_node(job, node)
        return agent_pb2.LaunchRequest(job=message, epoch=message.epoch, **read_models.launch_fields(session, job.id))

    @staticmethod
    def _record(  # type: ignore[no-untyped-def]
        session, outcome: PlanOutcome, trigger: str, horizon: Horizon, forecasts: dict[str, Forecast],
        changed: dict[str, Forecast],
    ) -> None:
        ls = outcome.live
        used = {job_id: fc.as_dict() for job_id, fc in forecasts.items()}
        repository.save_forecasts(session, {job_id: fc.as_dict() for job_id, fc in changed.items()})
        repository.record_plan_step(
            session, policy=outcome.policy, trigger=trigger[:128], step_seconds=horizon.step_s,
            horizon=horizon.steps, step_index=horizon.step_index,
            figures={**outcome.figures, "runtime_ms": outcome.runtime_ms, **outcome.stats},
            assignments=_assignments(ls, outcome.plan_grid, outcome.decision),
            grid=_grid_record(ls, outcome.plan_grid),
            forecasts={**used, **{j.id: {"demand": list(j.demand)} for j in ls.jobs.values() if j.realtime}},
        )

    def _fairness_config(self) -> FairnessConfig:
        s = self.settings
        return FairnessConfig(lease_s=s.fair_lease_s, starvation_s=s.fair_starvation_s, delay_s=s.fair_delay_s)

    def _refresh_cache(self, events: Events) -> None:
        try:
            holding = self.db.run(planner_view.holding_jobs)
            self.live.replace_placements(
                {j.id: {"node": j.node, "gpus": list(j.gpu_indices), "epoch": j.epoch} for j in holding}
            )
            self._publish(events)
        except Exception as exc:  # noqa: BLE001 - Redis is a cache; Postgres has it all
            log.warning("live state refresh failed: %s", exc)

    def _publish(self, events: Events) -> None:
        try:
            self.live.publish_job_events(events.items)
        except Exception as exc:  # noqa: BLE001 - Redis is a cache; Postgres has it all
            log.warning("publishing %d job events failed: %s", len(events.items), exc)

    async def _launch(self, address: str, request: agent_pb2.LaunchRequest) -> None:
        try:
            await self.agents.stub(address).Launch(request, timeout=10, metadata=self.agents.metadata)
        except grpc.aio.AioRpcError as exc:
            # The agent's next heartbeat lists this assignment and it launches it then.
            log.warning("launch of %s at %s failed (%s): reconciliation will retry", request.job.id, address, exc.code())

    async def _stop(self, address: str, job_id: str, epoch: int, reason: str, *,
                    grace_s: float = 10, deadline_s: float = 30) -> None:
        request = agent_pb2.StopRequest(job_id=job_id, epoch=epoch, reason=reason, grace_seconds=grace_s)
        try:
            await self.agents.stub(address).Stop(request, timeout=deadline_s, metadata=self.agents.metadata)
        except grpc.aio.AioRpcError as exc:
            # The job no longer holds GPUs in Postgres: the agent's next heartbeat stops it.
            log.warning("stop of %s at %s failed (%s): reconciliation will stop it", job_id, address, exc.code())

    async def _stop_stranded(self, dead: list[node_lifecycle.DeadNode]) -> None:
        """Stops the copies of the dead nodes' lost jobs, all at once and briefly: a killed
        agent refuses at once, a frozen one times out (its launchers fence themselves), one
        that only lost its way to the api answers and stops them, and so do a lost gang's
        live nodes. A node that can be neither heard nor dialled (cut off both ways) is
        left to its jobs' own ends."""
        await asyncio.gather(*(
            self._stop(copy.address, copy.job_id, copy.epoch, f"node {node.name} was declared dead",
                       grace_s=STRANDED_GRACE_S, deadline_s=STRANDED_STOP_DEADLINE_S)
            for node in dead for copy in node.copies))

    async def _resize(self, address: str, request: agent_pb2.ResizeRequest) -> None:
        try:
            await self.agents.stub(address).Resize(request, timeout=10, metadata=self.agents.metadata)
        except grpc.aio.AioRpcError as exc:
            # Reconciliation sees a newer epoch for the app and relaunches it on its new GPUs.
            log.warning("resize of %s at %s failed (%s): reconciliation will relaunch it", request.job_id, address, exc.code())


def _commit_resize(  # type: ignore[no-untyped-def]
    session, resize: Start, events: Events,
) -> tuple[str, agent_pb2.LaunchRequest | agent_pb2.ResizeRequest | int] | None:
    """The node's agent's part of a committed resize: a Resize of the replicas it runs, a
    Launch where the app arrives, or (an epoch) the Stop of the replicas where it leaves."""
    done = job_starts.commit_resize(session, resize, events)
    if done is None:
        return None
    if not done.gpus:
        return done.node, done.previous_epoch
    if not done.previous_epoch:
        message = job_protos.job_on_node(done.job, done.node)
        return done.node, agent_pb2.LaunchRequest(job=message, epoch=done.epoch)
    return done.node, agent_pb2.ResizeRequest(job_id=done.job.id, epoch=done.epoch, gpu_indices=list(done.gpus))



def _expected_fingerprint(view: planner_view.LiveView, decision: StepDecision, launched: set[str],
                          guests: Collection[str] = ()) -> Any:
    """The fingerprint the cluster will show once our own starts are in: they are no change
    (and the trials placed as guests leave the view: they hold no GPU of their own)."""
    started = {s.job_id: s.node for s in decision.starts if s.job_id in launched}
    nodes, jobs = view.fingerprint()
    return nodes, frozenset((job_id, started.get(job_id, node)) for job_id, node in jobs if job_id not in guests)


def _what_changed(before: Any, after: Any) -> str:
    (nodes_before, jobs_before), (nodes_after, jobs_after) = before, after
    if nodes_before != nodes_after:
        return "node change"
    ids_before, ids_after = {j for j, _ in jobs_before}, {j for j, _ in jobs_after}
    if ids_after - ids_before:
        return "arrival of " + ", ".join(sorted(ids_after - ids_before)[:3])
    if ids_before - ids_after:
        return "completion of " + ", ".join(sorted(ids_before - ids_after)[:3])
    return "placement change"


def _assignments(ls: LiveScenario, grid: list[list[str | None]], decision: StepDecision) -> dict[str, Any]:
    started = {s.job_id: s for s in [*decision.starts, *decision.resizes]}
    out: dict[str, Any] = {}
    for job_id, job in ls.jobs.items():
        entry: dict[str, Any] = {"tenant": job.tenant, "kind": job.kind, "planned_seconds": job.duration_s or 0}
        if job_id in started:
            entry.update(node=started[job_id].node, gpus=list(started[job_id].gpus), start_step=0)
            if started[job_id].nodes:
                entry["nodes"] = list(started[job_id].nodes)
        elif job.node is not None:
            entry.update(node=job.node, gpus=list(job.gpu_indices), start_step=-1)
            if job.gang_nodes:
                entry["nodes"] = list(job.gang_nodes)
        elif job_id in decision.planned_start:
            entry.update(start_step=decision.planned_start[job_id])
        else:
            entry.update(waiting=decision.waiting.get(job_id, ""))
        planned = decision.replica_sets.get(job_id)
        if planned:  # a realtime app: its replicas' GPUs on each node at step 0
            home = job.node if job.node in planned else max(planned, key=lambda n: (len(planned[n]), n))
            entry.update(node=home, gpus=list(planned[home]), replicas={n: list(g) for n, g in sorted(planned.items())})
        out[job_id] = entry
    return out


def _grid_record(ls: LiveScenario, grid: list[list[str | None]]) -> dict[str, Any]:
    """Rows run-length encoded ([[cell, count], ...]); reserved rows are left out."""
    labels: list[str] = []
    rows: list[list[list[Any]]] = []
    for g, row in enumerate(grid):
        where = ls.layout.where(g)
        if where is None:
            continue
        labels.append(f"{where[0]}/{where[1]}")
        runs: list[list[Any]] = []
        for cell in row:
            value = cell or ""
            if runs and runs[-1][0] == value:
                runs[-1][1] += 1
            else:
                runs.append([value, 1])
        rows.append(runs)
    return {"labels": labels, "rows": rows}


def _held_by_tenant(jobs: list[LiveJob]) -> dict[str, int]:
    """GPUs each tenant holds now (stage 1's allocated), from the cycle's own snapshot."""
    held: dict[str, int] = {}
    for j in jobs:
        if j.node is not None:
            held[j.tenant] = held.get(j.tenant, 0) + j.held_gpus
    return held


def _tenants_waiting(jobs: list[LiveJob]) -> int:
    """How many tenants have jobs waiting for GPUs (`fast` orders across them by standing)."""
    return len({j.tenant for j in jobs if j.node is None and not j.realtime})
