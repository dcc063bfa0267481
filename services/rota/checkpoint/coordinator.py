"""The checkpoint coordinator: checkpoint, pause, resume and migrate as durable operations.

Every operation is a row that moves through states, committed before the step it names:

    checkpoint, periodic, pause:  requested -> copying -> writing -> done | failed
    migrate:                      requested -> copying -> writing -> resuming -> done | failed
    migrate, streamed:            requested -> copying -> writing -> done | failed
    resume:                       requested -> done | failed (waits for a pause's write)

`requested`: the agent has not been asked, so a restart rolls the operation back and
nothing has changed. `copying`: the agent was asked; a restart asks the agent whether it
took the copy (finish) or not (roll back: the ranks were told to carry on). `writing`:
the copy was taken (a paused job is PAUSED and holds no GPU); a restart keeps polling the
agent's background write. The image being written is never the only one kept: retention
counts complete images only, so the last good image survives any failure here.

A migration of a job on one node is streamed (ROTA_CHECKPOINT_STREAM, the default): the
commit that records the copy also puts the job back in the queue, so it resumes on its
target while the image is written. The target's agent streams the state from the source
agent's staged copy (rota.agent.streaming; the read model checkpoint_streamed_images names
the image and its source for as long as the write goes on), and the operation is done
once the image is written. A write that fails leaves the job to resume from its last good
image: a target still waiting hears of the failure from the source and restores that one.

A gang (a job on several nodes) is one operation over every node's agent: each is asked
for its rank group's copy under the same request number, the ranks' own vote makes the
copy all-or-nothing across nodes (`rota.runtime.state`), and the image is complete once
every node's part is written: the coordinator joins the parts into one manifest, so a
restore anywhere hands each node the ranks it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import grpc
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rota.checkpoint import repository as repo
from rota.checkpoint.models import OperationRow
from rota.cluster import queries
from rota.cluster.job_lifecycle import Events, get_job, pause, transition
from rota.common import metrics
from rota.common.agents import AgentClients
from rota.common.db import Database
from rota.core import jobstate
from rota.core.errors import AlreadyExists, FailedPrecondition, NotFound
from rota.imagestore.images import join_parts
from rota.imagestore.settings import EXIT_GRACE_S, CheckpointSettings
from rota.v1 import agent_pb2, checkpoint_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")
COPY_KINDS = ("checkpoint", "periodic", "pause", "migrate")
PAUSING_KINDS = ("pause", "migrate")
WRITE_GIVE_UP_S = 3600.0  # an image still unwritten after this is failed
BUSY = (repo.REQUESTED, repo.COPYING, repo.RESUMING)


class AgentCallFailed(Exception):
    def __init__(self, message: str, definitive: bool = True) -> None:
        super().__init__(message)
        self.definitive = definitive  # False: no answer, the agent may have acted


# Answers after which the agent certainly did nothing.
DEFINITIVE = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED})


def _failed_call(exc: grpc.aio.AioRpcError) -> AgentCallFailed:
    return AgentCallFailed(exc.details() or exc.code().name, exc.code() in DEFINITIVE)


def image_state(status: agent_pb2.AgentImageStatusResponse) -> str:
    """writing | complete | failed | unknown (also for UNSPECIFIED, which no agent sends)."""
    if status.image_state == checkpoint_pb2.IMAGE_STATE_UNSPECIFIED:
        return "unknown"
    return checkpoint_pb2.ImageState.Name(status.image_state).removeprefix("IMAGE_STATE_").lower()


def _left(wait_s: float, budget_s: float | None, started: float) -> float:
    if budget_s is None:
        return wait_s
    return max(0.0, min(wait_s, budget_s - (time.monotonic() - started)))


class AgentPort(Protocol):
    async def checkpoint(self, address: str, request: agent_pb2.AgentCheckpointRequest,
                         timeout_s: float) -> agent_pb2.AgentCheckpointResponse: ...

    async def image_status(self, address: str, image_id: str) -> agent_pb2.AgentImageStatusResponse: ...


class GrpcAgents:
    def __init__(self, clients: AgentClients) -> None:
        self.clients = clients

    async def checkpoint(self, address: str, request: agent_pb2.AgentCheckpointRequest,
                         timeout_s: float) -> agent_pb2.AgentCheckpointResponse:
        try:
            reply: agent_pb2.AgentCheckpointResponse = await self.clients.stub(address).Checkpoint(  # type: ignore[misc]
                request, timeout=timeout_s, metadata=self.clients.metadata)
            return reply
        except grpc.aio.AioRpcError as exc:
            raise _failed_call(exc) from exc

    async def image_status(self, address: str, image_id: str) -> agent_pb2.AgentImageStatusResponse:
        try:
            reply: agent_pb2.AgentImageStatusResponse = await self.clients.stub(address).ImageStatus(  # type: ignore[misc]
                agent_pb2.AgentImageStatusRequest(image_id=image_id), timeout=10, metadata=self.clients.metadata)
            return reply
        except grpc.aio.AioRpcError as exc:
            raise _failed_call(exc) from exc


@dataclass(frozen=True)
class Placement:
    state: str
    node: str
    gpus: list[int]


class Coordinator:
    def __init__(self, db: Database, agents: AgentPort, settings: CheckpointSettings,
                 publish: Callable[[Events], None] | None = None, poll_s: float = 0.02) -> None:
        self.db = db
        self.agents = agents
        self.settings = settings
        self.publish = publish or (lambda events: None)
        self.poll_s = poll_s
        self.tasks: set[asyncio.Task[Any]] = set()

    async def _tx(self, fn: Callable[[Session, Events], T]) -> T:
        events = Events()
        result = await asyncio.to_thread(self.db.run, lambda s: fn(s, events))
        if events.items:
            self.publish(events)
        return result

    def _background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # The public operations. Each runs as a task of the coordinator (`_flow`), so a caller
    # that gives up at its deadline leaves a durable operation going, never half-done;
    # the caller waits, at most `budget_s`, for the state it reports.
    async def checkpoint(self, job_id: str, request_id: str = "", timeout_s: float = 0,
                         kind: str = "checkpoint", budget_s: float | None = None) -> OperationRow | None:
        op = await self._begin(job_id, kind, request_id, "", timeout_s)
        return await self._until(op.id, lambda o: o.state in repo.ENDED, budget_s)

    async def pause(self, job_id: str, request_id: str = "", timeout_s: float = 0,
                    budget_s: float | None = None) -> OperationRow | None:
        op = await self._begin(job_id, "pause", request_id, "", timeout_s)
        # Back once the GPUs are free: the image is written on in the background.
        return await self._until(op.id, lambda o: o.state not in (repo.REQUESTED, repo.COPYING), budget_s)

    async def resume(self, job_id: str, request_id: str = "", node: str = "", wait_s: float = 0,
                     budget_s: float | None = None) -> tuple[OperationRow | None, Placement]:
        started = time.monotonic()
        op = await self._begin(job_id, "resume", request_id, node, 0)
        done = await self._until(op.id, lambda o: o.state in repo.ENDED, budget_s)
        return done, await self.wait_placed(job_id, _left(wait_s, budget_s, started))

    async def migrate(self, job_id: str, request_id: str = "", node: str = "", timeout_s: float = 0,
                      wait_s: float = 0, budget_s: float | None = None,
                      reason: str = "") -> tuple[OperationRow | None, Placement]:
        started = time.monotonic()
        op = await self._begin(job_id, "migrate", request_id, node, timeout_s, reason)
        done = await self._until(op.id, lambda o: o.state in repo.ENDED, budget_s)
        return done, await self.wait_placed(job_id, _left(wait_s, budget_s, started))

    async def _begin(self, job_id: str, kind: str, request_id: str, target: str, timeout_s: float,
                     reason: str = "") -> OperationRow:
        def start(s: Session, e: Events) -> tuple[OperationRow, bool]:
            return self._start(s, job_id, kind, request_id, target, timeout_s, reason)

        try:
            op, new = await self._tx(start)
        except IntegrityError:
            if not request_id:
                raise
            # The same request id committed by a concurrent call for another job (each held
            # its own job's lock): this one now finds it, and answers as a repeat would.
            op, new = await self._tx(start)
        if new:
            self._background(self._flow(op))
        return op

    async def _flow(self, op: OperationRow) -> None:
        try:
            if op.kind in COPY_KINDS and await self._copy(op) is None:
                return
            await self._drive(op.id)
        except FailedPrecondition as exc:
            log.info("operation %s: %s", op.id, exc)  # recorded on the operation already
        except Exception:  # noqa: BLE001 - a task's failure must be logged, not lost
            log.exception("operation %s failed unexpectedly", op.id)

    async def operation(self, op_id: int) -> OperationRow | None:
        return await asyncio.to_thread(self.db.run, lambda s: s.get(OperationRow, op_id))

    async def _until(self, op_id: int, done: Callable[[OperationRow], bool], budget_s: float | None) -> OperationRow | None:
        """The operation once `done` (or ended), or as it stands when the budget runs out;
        None when it was dropped (a periodic checkpoint of a job that does not checkpoint)."""
        deadline = time.monotonic() + budget_s if budget_s is not None else None
        while True:
            op = await self.operation(op_id)
            if op is None or done(op) or op.state in repo.ENDED:
                return op
            if deadline is not None and time.monotonic() >= deadline:
                return op
            await asyncio.sleep(self.poll_s)

    # 1. A new operation (or the first one with the same request id).
    def _start(self, s: Session, job_id: str, kind: str, request_id: str, target: str,
               timeout_s: float, reason: str = "") -> tuple[OperationRow, bool]:
        found, job = repo.find_operation(s, request_id), None
        if found is None:
            job = get_job(s, job_id, lock=True)
            # A repeat of a request that was being committed while this one waited for the
            # job's lock is found now (each statement reads what is committed): without this
            # second look it would fail as "a migrate in progress", its own operation.
            found = repo.find_operation(s, request_id)
        if found is not None:
            return _same_request(found, job_id, kind, request_id), False
        if job is None:
            raise NotFound(f"job {job_id} not found")
        _refuse_overlap(s, job_id, kind)
        timeout = timeout_s if timeout_s > 0 else self.settings.timeout_s
        if kind in COPY_KINDS:
            return _start_copy(s, job, kind, request_id, target, timeout, reason), True
        if job.state != jobstate.PAUSED:
            raise FailedPrecondition(f"{job_id} is {job.state}: only a PAUSED job can be resumed")
        return repo.create_operation(s, job_id, kind, request_id, target_node=target,
                                     detail={"requested_at": time.time()}), True

    # 2. The copy: the agent's two-phase request to every rank (a gang: every node's agent).
    async def _copy(self, op: OperationRow) -> OperationRow | None:
        nodes = op_nodes(op)
        try:
            addresses = await self._tx(lambda s, e: self._mark_copying(s, op.id, nodes))
        except FailedPrecondition as exc:
            why = str(exc)
            await self._tx(lambda s, e: self._fail(s, op, why))
            raise
        timeout = op.detail["timeout_s"] + EXIT_GRACE_S + 10
        answers = await asyncio.gather(
            *(self.agents.checkpoint(address, self._request(op, i), timeout) for i, address in enumerate(addresses)),
            return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, AgentCallFailed):
                raise answer
        failures = [(n, a) for n, a in zip(nodes, answers, strict=True) if isinstance(a, AgentCallFailed)]
        if any(not a.definitive for _, a in failures):
            # No answer (a deadline, a lost connection): the agent may have taken the
            # copy all the same. Ask it until it must have decided.
            return op if await self._adopt_copy(op) else None
        if failures:
            why = "; ".join(f"{n}: {a}" if len(nodes) > 1 else str(a) for n, a in failures)
            await self._tx(lambda s, e: self._fail(s, op, why))
            raise FailedPrecondition(f"{op.kind} of {op.job_id} failed: {why}") from None
        replies = [a for a in answers if isinstance(a, agent_pb2.AgentCheckpointResponse)]
        if not any(r.registered for r in replies):
            await self._tx(lambda s, e: self._forget(s, op))
            return None
        if not all(r.registered for r in replies):
            why = "only some nodes' ranks registered their state with rota.runtime"
            await self._tx(lambda s, e: self._fail(s, op, why))
            raise FailedPrecondition(f"{op.kind} of {op.job_id} failed: {why}")
        copied = {"step": min(r.step for r in replies), "ranks": sum(r.ranks for r in replies),
                  "copy_s": max(r.copy_seconds for r in replies), "pause_s": max(r.pause_seconds for r in replies),
                  "logical_bytes": sum(r.logical_bytes for r in replies)}
        await self._record_copied(op.id, copied)
        return op

    @staticmethod
    def _request(op: OperationRow, node_rank: int) -> agent_pb2.AgentCheckpointRequest:
        """The request to the `node_rank`-th node of the operation (a gang's: for its ranks only,
        under one request number on every node, so that all the gang's ranks serve it)."""
        request = agent_pb2.AgentCheckpointRequest(
            job_id=op.job_id, epoch=op.detail["epoch"], image_id=op.image_id or "", pause=op.kind in PAUSING_KINDS,
            timeout_seconds=op.detail["timeout_s"], skip_unregistered=op.kind == "periodic",
        )
        per_node = int(op.detail.get("ranks_per_node", 0))
        if "nodes" in op.detail:
            request.seq = op.id
            request.local_ranks.extend(range(node_rank * per_node, (node_rank + 1) * per_node))
        return request

    async def _record_copied(self, op_id: int, copied: dict[str, Any]) -> None:
        await self._tx(lambda s, e: self._copied(s, op_id, copied, e))

    async def _record_written(self, op: OperationRow, written: Written) -> None:
        await self._tx(lambda s, e: self._written(s, op, written))

    async def _failed(self, op: OperationRow, why: str) -> None:
        await self._tx(lambda s, e: self._fail(s, op, why))

    def _mark_copying(self, s: Session, op_id: int, nodes: list[str]) -> list[str]:
        addresses = [_address(s, node) for node in nodes]
        repo.set_operation(s, op_id, repo.COPYING)
        return addresses

    def _copied(self, s: Session, op_id: int, copied: dict[str, Any], events: Events) -> None:
        op = s.get(OperationRow, op_id, with_for_update=True)
        assert op is not None and op.image_id is not None
        repo.set_image_copy(s, op.image_id, step=copied["step"], ranks=copied["ranks"], copy_s=copied["copy_s"],
                            logical=copied["logical_bytes"])
        if op.kind in PAUSING_KINDS:
            job = get_job(s, op.job_id, lock=True)
            # The agent's heartbeat may have reported the paused exit first: then it is PAUSED.
            if job is not None and job.state == jobstate.RUNNING and job.epoch == op.detail["epoch"]:
                why = f": {op.reason}" if op.reason else ""
                pause(s, job, f"paused at step {copied['step']} into image {op.image_id} "
                              f"({copied['pause_s']:.2f}s to GPUs released){why}", events)
            if op.kind == "migrate" and job is not None and self._streams(op) and job.state == jobstate.PAUSED:
                where = f" ({op.target_node} preferred)" if op.target_node else ""
                transition(s, job, jobstate.PENDING, f"resumed from image {op.image_id} at step {copied['step']} "
                           f"as it is written, its state streamed from {op.detail['node']}{where}", events)
                copied = {**copied, "streamed": True}
        op.detail = {**op.detail, **copied}
        repo.set_operation(s, op_id, repo.WRITING)

    def _streams(self, op: OperationRow) -> bool:
        """Whether this migration resumes its job before the image is written: one node's
        job (a gang's parts are joined only once all are written), streaming switched on."""
        return self.settings.stream_migrations and "nodes" not in op.detail

    def _fail(self, s: Session, op: OperationRow, error: str) -> None:
        if op.image_id:
            repo.fail_image(s, op.image_id, error)
        last = repo.latest_image(s, op.job_id)
        keep = f"; the last good image is {last.id} (step {last.step})" if last is not None else ""
        repo.set_operation(s, op.id, repo.FAILED, error=(error + keep)[:4000])
        _observe_end(op, "failed")

    @staticmethod
    def _forget(s: Session, op: OperationRow) -> None:
        row = s.get(OperationRow, op.id)
        if row is not None:
            s.delete(row)
        if op.image_id:
            image = s.get(repo.ImageRow, op.image_id)
            if image is not None:
                s.delete(image)

    # 3. Drive an operation from wherever it stands to its end.
    async def _drive(self, op_id: int) -> None:
        op = await self.operation(op_id)
        if op is not None and op.state == repo.WRITING:
            await self._await_write(op)
            op = await self.operation(op_id)
        if op is None:
            return
        if op.state == repo.RESUMING or (op.kind == "resume" and op.state == repo.REQUESTED):
            await self._resume(op)

    async def _await_write(self, op: OperationRow) -> None:
        nodes = op_nodes(op)
        addresses = await asyncio.to_thread(self.db.run, lambda s: [_address(s, n) for n in nodes])
        give_up = time.time() + WRITE_GIVE_UP_S
        done: dict[str, agent_pb2.AgentImageStatusResponse] = {}
        while len(done) < len(nodes):
            for node, address in zip(nodes, addresses, strict=True):
                if node in done:
                    continue
                try:
                    status = await self.agents.image_status(address, op.image_id or "")
                except AgentCallFailed as exc:
                    if time.time() > give_up:
                        await self._failed(op, f"image write never confirmed{_on(node, nodes)}: {exc}")
                        return
                    continue
                state = image_state(status)
                if state == "complete":
                    done[node] = status
                elif state != "writing":
                    await self._failed(op, f"image write failed{_on(node, nodes)}: {status.error or state}")
                    return
            if len(done) < len(nodes):
                await asyncio.sleep(self.poll_s * 5)  # an RPC a poll: less often than the database
        try:
            written = await asyncio.to_thread(self._joined, op, [done[n] for n in nodes])
        except ValueError as exc:
            await self._failed(op, f"image parts do not fit together: {exc}")
            return
        await self._record_written(op, written)

    def _joined(self, op: OperationRow, parts: list[agent_pb2.AgentImageStatusResponse]) -> Written:
        """The image as written: one node's, or a gang's parts joined into one manifest, which
        then goes to the chunk store beside the chunks (a restore reads it from there)."""
        manifests = [json.loads(p.manifest_json) for p in parts]
        manifest = manifests[0] if len(parts) == 1 else join_parts(manifests)
        if len(parts) > 1:
            self.settings.store().put_manifest(op.image_id or "", json.dumps(manifest).encode())
        return Written(manifest, step=min(p.step for p in parts), write_s=max(p.write_seconds for p in parts),
                       stored_bytes=sum(p.written_bytes for p in parts))

    def _written(self, s: Session, op: OperationRow, written: Written) -> None:
        assert op.image_id is not None
        copy_s = float(op.detail.get("copy_s", 0.0))
        repo.complete_image(s, op.image_id, written.manifest, step=written.step, copy_s=copy_s,
                            write_s=written.write_s)
        # A migration ends once resumed (_requeue); a streamed one was resumed at its copy.
        resumes = op.kind == "migrate" and not op.detail.get("streamed")
        resumed = {"image_id": op.image_id, "step": written.step} if op.kind == "migrate" and not resumes else {}
        repo.merge_detail(s, op.id, write_s=written.write_s, stored_bytes=written.stored_bytes, **resumed)
        repo.set_operation(s, op.id, repo.RESUMING if resumes else repo.DONE)
        metrics.CHECKPOINT_BYTES.labels(kind="logical").inc(int(op.detail.get("logical_bytes", 0)))
        metrics.CHECKPOINT_BYTES.labels(kind="stored").inc(written.stored_bytes)
        if not resumes:
            _observe_end(op, "done")

    async def _resume(self, op: OperationRow) -> None:
        # A pause's image may still be on its way to the store: resume from it, not an older one.
        give_up = time.time() + WRITE_GIVE_UP_S
        while await asyncio.to_thread(self.db.run, lambda s: repo.pending_write(s, op.job_id) is not None):
            if time.time() > give_up:
                break
            await asyncio.sleep(self.poll_s)
        await self._tx(lambda s, e: self._requeue(s, op.id, e))

    def _requeue(self, s: Session, op_id: int, events: Events) -> None:
        op = s.get(OperationRow, op_id, with_for_update=True)
        assert op is not None
        job = get_job(s, op.job_id, lock=True)
        if job is None or job.state in jobstate.FINAL_STATES:
            repo.set_operation(s, op_id, repo.FAILED, error=f"{op.job_id} is {job.state if job else 'gone'}")
            return
        image = repo.latest_image(s, op.job_id)
        if job.state == jobstate.PAUSED:
            where = f" ({op.target_node} preferred)" if op.target_node else ""
            source = f"from image {image.id} at step {image.step}" if image is not None else "with no image: from the start"
            transition(s, job, jobstate.PENDING, f"resumed {source}{where}", events)
        detail = {"image_id": image.id, "step": image.step} if image is not None else {}
        op.detail = {**op.detail, **detail}
        repo.set_operation(s, op_id, repo.DONE)
        _observe_end(op, "done")

    async def wait_placed(self, job_id: str, wait_s: float) -> Placement:
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            job = await asyncio.to_thread(self.db.run, lambda s: get_job(s, job_id))
            if job is None:
                raise NotFound(f"job {job_id} not found")
            placed = Placement(job.state, job.node or "", list(job.gpu_indices))
            if job.state in jobstate.HOLDING_STATES or job.state in jobstate.FINAL_STATES:
                return placed
            if time.monotonic() >= deadline:
                return placed
            await asyncio.sleep(self.poll_s)

    # 4. After a restart: finish or roll back what the previous coordinator left.
    async def recover(self) -> int:
        ops = await asyncio.to_thread(self.db.run, repo.unfinished_operations)
        for op in ops:
            self._background(self._recover_one(op))
        return len(ops)

    async def _recover_one(self, op: OperationRow) -> None:
        try:
            if op.state == repo.REQUESTED and op.kind in COPY_KINDS:
                await self._tx(lambda s, e: self._fail(
                    s, op, "rolled back: the coordinator restarted before asking the agent; nothing changed"))
                return
            if op.state == repo.COPYING:
                if not await self._adopt_copy(op):
                    return
            await self._drive(op.id)
        except Exception:  # noqa: BLE001 - one bad record must not stop the others
            log.exception("recovering operation %s failed", op.id)

    async def _adopt_copy(self, op: OperationRow) -> bool:
        """Did the agents take the copy? They may still be waiting for ranks: ask until they
        must have decided (the ranks' timeout and exit grace), then finish or roll back."""
        nodes = op_nodes(op)
        addresses = await asyncio.to_thread(self.db.run, lambda s: [_address(s, n) for n in nodes])
        decided_by = op.updated_at.timestamp() + op.detail["timeout_s"] + EXIT_GRACE_S + 5
        while True:
            taken: list[agent_pb2.AgentImageStatusResponse] = []
            for address in addresses:
                try:
                    status = await self.agents.image_status(address, op.image_id or "")
                except AgentCallFailed:
                    continue
                if image_state(status) != "unknown":
                    taken.append(status)
            if len(taken) == len(nodes):
                copied = {"step": min(t.step for t in taken), "ranks": sum(t.ranks for t in taken), "copy_s": 0.0,
                          "pause_s": 0.0, "logical_bytes": sum(t.logical_bytes for t in taken)}
                await self._record_copied(op.id, copied)
                return True
            if time.time() > decided_by:
                why = ("rolled back: the coordinator restarted mid-copy and the agent took no copy; the job carries on"
                       if not taken else f"rolled back: only {len(taken)} of {len(nodes)} nodes took their copy")
                await self._failed(op, why)
                return False
            await asyncio.sleep(self.poll_s * 5)

    # 5. Periodic checkpoints, for fault tolerance.
    async def run_periodic_forever(self) -> None:
        interval = self.settings.interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(min(interval, 30.0))
            try:
                due = await asyncio.to_thread(self.db.run, lambda s: repo.running_jobs_due(s, timedelta(seconds=interval)))
                for job_id, _node, _epoch in due:
                    try:
                        await self.checkpoint(job_id, kind="periodic")
                    except (FailedPrecondition, NotFound) as exc:
                        log.info("periodic checkpoint of %s skipped: %s", job_id, exc)
            except Exception:  # noqa: BLE001 - the loop outlives any one failure
                log.exception("periodic checkpoints failed")


@dataclass(frozen=True)
class Written:
    """A complete image as the agents wrote it (a gang's parts joined)."""

    manifest: dict[str, Any]
    step: int
    write_s: float
    stored_bytes: int


def _observe_end(op: OperationRow, outcome: str) -> None:
    """rota_checkpoint_operation_seconds: request to end (a pause's includes its background write)."""
    requested = float(op.detail.get("requested_at", 0.0) or 0.0)
    if requested > 0:
        metrics.CHECKPOINT_SECONDS.labels(kind=op.kind, outcome=outcome).observe(max(0.0, time.time() - requested))


def op_nodes(op: OperationRow) -> list[str]:
    """The nodes an operation's copy is taken on: a gang's, in node rank order; else its one."""
    return list(op.detail.get("nodes") or [op.detail["node"]])


def _on(node: str, nodes: list[str]) -> str:
    return f" on {node}" if len(nodes) > 1 else ""


def _address(s: Session, node: str) -> str:
    row = queries.get_node(s, node)
    if row is None:
        raise FailedPrecondition(f"node {node} is not registered")
    return row.address


class _CopiedJob(Protocol):
    """What `_start_copy` reads of the job's row."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def node(self) -> str | None: ...
    @property
    def epoch(self) -> int: ...
    @property
    def gang_nodes(self) -> list[str]: ...
    @property
    def gpu_indices(self) -> list[int]: ...


def _same_request(found: OperationRow, job_id: str, kind: str, request_id: str) -> OperationRow:
    """The operation a repeated request id names, if it is this same request."""
    if found.job_id != job_id:
        # Operation ids are one namespace for every tenant: the job it names may be
        # another tenant's, so its id (and what was done to it) is not told.
        raise AlreadyExists(f"operation id {request_id!r} was used for another job's operation: choose another")
    if found.kind != kind:
        raise AlreadyExists(f"operation id {request_id!r} was used for a {found.kind} of {found.job_id}")
    return found


def _refuse_overlap(s: Session, job_id: str, kind: str) -> None:
    for busy in repo.active_operations(s, job_id):
        # Only a write may overlap: a checkpoint's with anything, a pause's with its resume.
        overlaps = busy.state == repo.WRITING and (
            busy.kind in ("checkpoint", "periodic") or (busy.kind == "pause" and kind == "resume"))
        if not overlaps:
            raise FailedPrecondition(f"{job_id} has a {busy.kind} in progress (operation {busy.id}, {busy.state})")


def _start_copy(s: Session, job: _CopiedJob, kind: str, request_id: str, target: str, timeout: float,
                reason: str) -> OperationRow:
    """A checkpoint, pause or migrate of a RUNNING job: its image begun and its operation created."""
    job_id = job.id
    if job.state != jobstate.RUNNING or not job.node:
        raise FailedPrecondition(f"{job_id} is {job.state}: only a RUNNING job can be checkpointed or paused")
    if job.gang_nodes and target:
        raise FailedPrecondition(f"{job_id} is a gang on {len(job.gang_nodes)} nodes: it restarts where the "
                                 "plan puts all of it; migrate it without a node")
    image = repo.begin_image(s, job_id, "pause" if kind in PAUSING_KINDS else kind, job.node)
    detail: dict[str, Any] = {"node": job.node, "epoch": job.epoch, "timeout_s": timeout,
                              "requested_at": time.time()}
    if job.gang_nodes:  # node rank order: node i runs ranks i*m .. i*m+m-1
        detail |= {"nodes": list(job.gang_nodes), "ranks_per_node": len(job.gpu_indices)}
    return repo.create_operation(s, job_id, kind, request_id, image_id=image.id, target_node=target,
                                 reason=reason, detail=detail)
