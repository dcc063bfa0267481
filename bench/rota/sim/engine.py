"""Discrete-event simulator of a GPU cluster under one scheduling policy (docs/design.md §4).

Events are arrivals, finishes, lease expiries and checkpoint completions. After every
batch of events at one instant the policy runs a round: it orders the candidates
(pending jobs, plus running jobs whose lease just expired when the policy preempts) and
offers them to `try_place`, which puts each in a buddy block or refuses.

Overheads (paper's defaults): a preempted job keeps its GPUs `checkpoint_s` longer to
save its state, and a resumed job spends `resume_s` of its new interval restoring before
it makes progress again. A lease renewed in place costs `renew_s` (default 0). So a job's
intervals sum to duration + preemptions·(checkpoint_s + resume_s) + renewals·renew_s.

A GPU freed by a checkpointing job is given away at once, but its new job starts only
when the checkpoint ends: `busy_until` per GPU keeps intervals on a GPU from overlapping.

A job larger than a node gets whole, adjacent nodes (the buddy rule). Nodes may have GPU
types and switches (`SimConfig.node_types`, `node_switches`, one entry per node); a job
that accepts only some types, or must stay under one switch, then takes only the blocks
the live planner's start masks allow (`rota.core.planning.constraints`), so the two agree.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rota.core.fairness.ltgf import FairnessConfig, JobShareClock, TenantAccount, quotas
from rota.core.planning.constraints import StartMasks
from rota.core.planning.scenario import Scenario
from rota.sim.buddy import Buddy
from rota.sim.workload import Job

PENDING, RUNNING, CHECKPOINTING, DONE = range(4)
# Event kinds, in the order they are handled at one instant: finishes free GPUs before
# leases are judged.
FINISH, READY, ARRIVE, LEASE = range(4)


@dataclass(frozen=True)
class SimConfig:
    gpus: int
    gpus_per_node: int = 8
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    checkpoint_s: float = 5.0
    resume_s: float = 20.0
    renew_s: float = 0.0
    # Per node (gpus // gpus_per_node entries) or empty: not modelled, no constraint.
    node_types: tuple[str, ...] = ()
    node_switches: tuple[str, ...] = ()


@dataclass(eq=False, slots=True)
class Run:
    """A job's life in the simulator."""

    idx: int
    job: Job
    order: int  # log2(gpus)
    remaining: float  # seconds of work left
    state: int = PENDING
    block: int = -1
    start: float = 0.0  # start of the current interval
    work_start: float = 0.0  # start + restore overhead: progress begins here
    last_start: float = -math.inf
    pending_since: float = 0.0
    epoch: int = 0  # bumps invalidate queued events
    held_s: float = 0.0  # closed intervals' total length
    intervals: list[list[float]] = field(default_factory=list)
    end_s: float = math.nan
    allowed: int | None = None  # starts its GPU types and switch allow; None: any

    @property
    def tenant(self) -> str:
        return self.job.tenant

    @property
    def gpus(self) -> int:
        return self.job.gpus

    def held(self, now: float) -> float:
        """Seconds this job has held GPUs up to `now` (U_j / n_j)."""
        open_s = max(0.0, now - self.start) if self.state in (RUNNING, CHECKPOINTING) else 0.0
        return self.held_s + open_s


class TryPlace(Protocol):
    def __call__(self, r: Run, displace: bool = True) -> bool: ...


class Policy(Protocol):
    name: str
    preemptive: bool

    def walk(
        self,
        sim: Simulator,
        now: float,
        cands: list[Run],
        try_place: TryPlace,
        done: Callable[[], bool],
    ) -> None: ...


class Simulator:
    def __init__(self, jobs: Sequence[Job], shares: Mapping[str, float], cfg: SimConfig, policy: Policy):
        self.cfg, self.policy = cfg, policy
        self.fcfg = cfg.fairness
        self.alloc = Buddy(cfg.gpus, cfg.gpus_per_node)
        self.busy_until = [0.0] * cfg.gpus
        self.shares = dict(shares)
        self.quota = quotas(cfg.gpus, self.shares)
        for j in jobs:
            if j.tenant not in self.shares:
                raise ValueError(f"job {j.id}: tenant {j.tenant!r} is not in the tenants file")
            if j.gpus > cfg.gpus or j.gpus & (j.gpus - 1):
                raise ValueError(f"job {j.id}: {j.gpus} GPUs cannot be placed on {cfg.gpus} GPUs")
        masks = _masks(cfg)
        self.runs = [
            Run(i, j, j.gpus.bit_length() - 1, j.duration_s, allowed=_allowed(j, masks)) for i, j in enumerate(jobs)
        ]
        self.pending: dict[int, Run] = {}
        self.pending_by_tenant: dict[str, dict[int, Run]] = {t: {} for t in self.shares}
        self.pending_by_order = [0] * (self.alloc.max_order + 1)
        self.accounts = {t: TenantAccount(t, self.quota[t], self.fcfg) for t in self.shares}
        self.clocks = {t: JobShareClock(self.quota[t]) for t in self.shares}
        self.demand = dict.fromkeys(self.shares, 0)
        self.holding = dict.fromkeys(self.shares, 0)  # GPUs held, checkpointing included
        self._dirty: set[str] = set()
        self._events: list[tuple[float, int, int, int]] = []  # (time, kind, run idx, epoch)
        self.rounds = 0
        # At most one reservation: a starving job's block, drained GPU by GPU (see reserve).
        self.resv: Run | None = None
        self.resv_off = 0
        self.resv_held: list[int] = []
        for r in self.runs:
            self._push(r.job.submit_s, ARRIVE, r)

    # -- events ----------------------------------------------------------------------
    def _push(self, t: float, kind: int, r: Run) -> None:
        heapq.heappush(self._events, (t, kind, r.idx, r.epoch))

    def run(self) -> list[Run]:
        """Replay the whole trace; returns every job's Run, in trace order."""
        ev = self._events
        while ev:
            now = ev[0][0]
            expired: list[Run] = []
            while ev and ev[0][0] == now:
                _, kind, idx, epoch = heapq.heappop(ev)
                r = self.runs[idx]
                if epoch != r.epoch:
                    continue
                if kind == ARRIVE:
                    self._arrive(r, now)
                elif kind == FINISH:
                    self._finish(r, now)
                elif kind == READY:
                    self._ready(r, now)
                elif r.state == RUNNING:
                    expired.append(r)
            self._round(now, expired)
            for t in self._dirty:
                self.accounts[t].set_load(now, self.demand[t], self.holding[t])
            self._dirty.clear()
        return self.runs

    def _arrive(self, r: Run, now: float) -> None:
        self._enqueue(r, now)
        self.demand[r.tenant] += r.gpus
        self.clocks[r.tenant].add(now, r.job.id, r.gpus, r.job.priority)
        self._dirty.add(r.tenant)

    def _enqueue(self, r: Run, now: float) -> None:
        r.state, r.pending_since = PENDING, now
        self.pending[r.idx] = r
        self.pending_by_tenant[r.tenant][r.idx] = r
        self.pending_by_order[r.order] += 1

    def _finish(self, r: Run, now: float) -> None:
        self._close(r, now)
        self._release(r.block, r.order)
        r.state, r.end_s, r.remaining = DONE, now, 0.0
        self.demand[r.tenant] -= r.gpus
        self.clocks[r.tenant].remove(now, r.job.id)

    def _ready(self, r: Run, now: float) -> None:
        """Checkpoint written: the job lets go of its GPUs and queues again."""
        self.holding[r.tenant] -= r.gpus
        self._dirty.add(r.tenant)
        self._enqueue(r, now)

    def _close(self, r: Run, end: float) -> None:
        r.intervals.append([r.start, end])
        r.held_s += end - r.start
        if r.state == RUNNING:
            self.holding[r.tenant] -= r.gpus
            self._dirty.add(r.tenant)

    # -- state changes a round decides -------------------------------------------------
    def _start(self, r: Run, off: int, now: float) -> None:
        n = r.gpus
        del self.pending[r.idx]
        del self.pending_by_tenant[r.tenant][r.idx]
        self.pending_by_order[r.order] -= 1
        start = max(now, max(self.busy_until[off : off + n]))
        r.state, r.block, r.start, r.last_start = RUNNING, off, start, start
        r.work_start = start + (self.cfg.resume_s if r.intervals else 0.0)
        self.holding[r.tenant] += n
        self._dirty.add(r.tenant)
        self._schedule(r, start)

    def _schedule(self, r: Run, lease_from: float) -> None:
        r.epoch += 1
        finish = r.work_start + r.remaining
        self._push(finish, FINISH, r)
        if self.policy.preemptive and lease_from + self.fcfg.lease_s < finish:
            self._push(lease_from + self.fcfg.lease_s, LEASE, r)

    def _progress(self, r: Run, now: float) -> None:
        r.remaining -= max(0.0, now - r.work_start)
        r.work_start = max(r.work_start, now)

    def _renew(self, r: Run, now: float) -> None:
        self._progress(r, now)
        r.work_start += self.cfg.renew_s
        self._schedule(r, now)

    def _preempt(self, r: Run, now: float) -> None:
        """Checkpoint at `now`: progress so far is kept, the GPUs stay busy for checkpoint_s."""
        self._progress(r, now)
        end = now + self.cfg.checkpoint_s
        r.intervals.append([r.start, end])
        r.held_s += end - r.start
        for g in range(r.block, r.block + r.gpus):
            self.busy_until[g] = end
        r.state = CHECKPOINTING
        r.epoch += 1
        self._push(end, READY, r)

    # -- one scheduling round ----------------------------------------------------------
    def _round(self, now: float, expired: list[Run]) -> None:
        # 0. A reservation whose block has drained starts before anything else.
        self._start_reserved(now)
        # 1. Leases of jobs restarted under delay_s ago are renewed without a contest.
        if expired:
            fresh = [r for r in expired if now - r.last_start < self.fcfg.delay_s]
            for r in fresh:
                self._renew(r, now)
            expired = [r for r in expired if now - r.last_start >= self.fcfg.delay_s]
        # 2. Nothing to decide when no waiting job could use what is or may become free.
        smallest = next((k for k, c in enumerate(self.pending_by_order) if c), -1)
        if smallest < 0 or (not expired and smallest > self.alloc.largest_free_order()):
            for r in expired:
                self._renew(r, now)
            return
        self.rounds += 1
        # 3. Expired jobs' GPUs are put up for grabs, marked soft so idle GPUs go first.
        soft = bytearray(self.cfg.gpus) if expired else None
        for r in expired:
            self._release(r.block, r.order)
            soft[r.block : r.block + r.gpus] = b"\x01" * r.gpus  # type: ignore[index]
        placer = _Placer(self.alloc, soft, len(expired))
        cands = list(self.pending.values()) + expired
        self.policy.walk(self, now, cands, placer.try_place, lambda: self.alloc.free_gpus == 0)
        # 4. An expired job nobody displaced keeps running (idle GPUs help nobody);
        #    one whose block was taken is checkpointed.
        for r in expired:
            if r.idx in placer.kept or self.alloc.claim(r.block, r.order):
                self._renew(r, now)
            else:
                self._preempt(r, now)
        for r, off in placer.placed:
            self._start(r, off, now)
        self._start_reserved(now)

    # -- reservation for a starving job ------------------------------------------------
    def reserve(self, r: Run) -> None:
        """Hold back, for pending job `r`, the aligned block of its size that is most free:
        its free GPUs are taken now and each one freed later is taken too, so smaller jobs
        cannot keep backfilling it; leases inside it expire into the reservation and
        cannot be renewed. Without this, a job larger than any free fragment starves while
        the cluster stays full. One reservation at a time; used by `fair` only."""
        if self.resv is not None or r.state != PENDING:
            return
        free = bytearray(self.cfg.gpus)
        for k, offs in enumerate(self.alloc.free):
            for off in offs:
                free[off : off + (1 << k)] = b"\x01" * (1 << k)
        n = r.gpus
        starts = [off for off in range(0, self.cfg.gpus - n + 1, n) if r.allowed is None or r.allowed >> off & 1]
        best = max(starts, key=lambda off: (free.count(1, off, off + n), -off))
        self.resv, self.resv_off, self.resv_held = r, best, []
        self._grab()

    def _grab(self) -> None:
        assert self.resv is not None
        held = set(self.resv_held)
        for g in range(self.resv_off, self.resv_off + self.resv.gpus):
            if g not in held and self.alloc.claim(g, 0):
                self.resv_held.append(g)

    def _release(self, off: int, order: int) -> None:
        self.alloc.release(off, order)
        if (
            self.resv is not None
            and off < self.resv_off + self.resv.gpus
            and self.resv_off < off + (1 << order)
        ):
            self._grab()

    def _drop_reservation(self) -> None:
        held, self.resv, self.resv_held = self.resv_held, None, []
        for g in held:
            self.alloc.release(g, 0)

    def _start_reserved(self, now: float) -> None:
        r = self.resv
        if r is None:
            return
        if r.state != PENDING:  # placed elsewhere this round
            self._drop_reservation()
        elif len(self.resv_held) == r.gpus:
            off = self.resv_off
            self._drop_reservation()
            self.alloc.claim(off, r.order)
            self._start(r, off, now)


def _masks(cfg: SimConfig) -> StartMasks | None:
    """The live planner's start masks over the simulated nodes, when types or switches are given."""
    nodes = cfg.gpus // cfg.gpus_per_node
    for name, labels in (("node_types", cfg.node_types), ("node_switches", cfg.node_switches)):
        if labels and len(labels) != nodes:
            raise ValueError(f"{name} has {len(labels)} entries, the cluster has {nodes} nodes")
    if not cfg.node_types and not cfg.node_switches:
        return None
    return start_masks(cfg.gpus, cfg.gpus_per_node, cfg.node_types, cfg.node_switches)


def start_masks(gpus: int, per_node: int, node_types: tuple[str, ...], node_switches: tuple[str, ...]) -> StartMasks:
    """The masks of a plan grid padded to a power of two, as the live planner's is: the
    padding nodes have no type and a switch of their own, so no typed or same-switch block
    reaches them, and the buddy never offers one that does."""
    rows = 1 << max(0, gpus - 1).bit_length()
    pad = (rows - gpus) // per_node
    types = (*node_types, *[""] * pad) if node_types else ()
    switches = (*node_switches, *(f"~pad-{i}" for i in range(pad))) if node_switches else ()
    return StartMasks(Scenario("sim", rows, 1, per_node, node_types=types, node_switches=switches))


def _allowed(j: Job, masks: StartMasks | None) -> int | None:
    if masks is None or not (j.gpu_types or j.same_switch):
        return None
    allowed = masks.allowed_for(j.gpu_types, j.same_switch, j.gpus)
    if not allowed:
        what = f" of type {' or '.join(sorted(j.gpu_types))}" if j.gpu_types else ""
        where = " under one switch" if j.same_switch else ""
        raise ValueError(f"job {j.id}: no aligned block of {j.gpus} GPUs{what}{where} in the cluster")
    return allowed


class _Placer:
    """A round's placements: running jobs that keep their block, and pending jobs' new blocks.
    `soft` marks the expired jobs' GPUs, which go last while any expired job may still keep its own."""

    def __init__(self, alloc: Buddy, soft: bytearray | None, expired: int) -> None:
        self.alloc, self.soft, self.expired = alloc, soft, expired
        self.largest = alloc.largest_free_order()
        self.kept: set[int] = set()
        self.placed: list[tuple[Run, int]] = []

    def try_place(self, r: Run, displace: bool = True) -> bool:
        """Place `r`; with displace=False a pending job may not take an expired job's GPUs."""
        if r.order > self.largest:
            return False
        if r.state == RUNNING:
            if not self.alloc.claim(r.block, r.order):
                return False
            self.kept.add(r.idx)
            self.soft[r.block : r.block + r.gpus] = bytes(r.gpus)  # type: ignore[index]
        else:
            contested = self.soft if len(self.kept) < self.expired else None
            off = self.alloc.alloc(r.order, contested, displace, r.allowed)
            if off is None:
                return False
            self.placed.append((r, off))
        self.largest = self.alloc.largest_free_order()
        return True
