"""Group commit for submissions: concurrent SubmitJob calls share one commit.

A submission is acknowledged only after the statement holding it has committed (with the
server's synchronous_commit, after its WAL flush), so durability is the same as one
transaction per call; what changes is that one commit serves every call that arrived
while the previous batch was being written. At low load a batch is a single submission
and nothing waits for company; under load batches grow by themselves.

The writer talks to PostgreSQL directly (psycopg's asyncio connection, in the event loop):
a batch is one INSERT ... ON CONFLICT statement in autocommit (`rota.cluster.submissions.store_batch`), i.e. one round trip
including its commit, without an ORM session or a worker thread per call (both cost more
CPU than the insert itself). If a batch fails for a reason other than an outage (a tenant
deleted under it, a value the column cannot hold), each submission is retried alone, so
one bad submission cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rota.cluster import submissions
from rota.common.db import CONNECT_TIMEOUT_S, application_name, libpq_url
from rota.core.errors import DomainError, InvalidArgument, Unavailable

log = logging.getLogger(__name__)

# Bounds one statement's size (and the latency of the calls inside it).
MAX_BATCH = 256
# Batches in flight at once, one connection each: while one commits, the next is written.
IN_FLIGHT = 2
# A batch that takes longer has lost its server (a cut network does not always say so):
# its connection is dropped and its callers get UNAVAILABLE (retrying with the same
# request id is safe whether or not it committed).
BATCH_TIMEOUT_S = 10.0

Outcome = submissions.Stored | BaseException


@dataclass
class _Pending:
    item: submissions.Submission
    future: asyncio.Future[submissions.Stored] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class SubmitBatcher:
    """`await submit(item)` returns where the submission is stored, once committed.

    `on_committed` runs in the event loop after each commit with the batch's new jobs
    (submission and creation time), for what must follow a commit but must not delay the
    answer (events to Redis).
    """

    def __init__(
        self, database_url: str, on_committed: Callable[[list[tuple[submissions.Submission, submissions.Stored]]], None] | None = None,
        *, name: str = "rota-api", max_batch: int = MAX_BATCH, in_flight: int = IN_FLIGHT,
    ) -> None:
        self._url = libpq_url(database_url)
        self._name = name
        self._on_committed = on_committed
        self._max_batch = max_batch
        self._max_in_flight = in_flight
        self._in_flight = 0
        self._flush_scheduled = False
        self._idle: list[psycopg.AsyncConnection[tuple[Any, ...]]] = []
        self._queue: list[_Pending] = []
        self._batches: set[asyncio.Task[None]] = set()
        self.batches = 0  # counters, for a benchmark to read
        self.submissions = 0

    async def submit(self, item: submissions.Submission) -> submissions.Stored:
        pending = _Pending(item)
        self._queue.append(pending)
        self._schedule_flush()
        # A caller that gives up (its deadline) does not cancel the write: its retry with
        # the same request id then finds the committed job.
        return await asyncio.shield(pending.future)

    def _schedule_flush(self) -> None:
        # At the end of this loop iteration, so every call that arrived in it joins.
        if self._queue and self._in_flight < self._max_in_flight and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._queue and self._in_flight < self._max_in_flight:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            self._in_flight += 1
            task = asyncio.create_task(self._write(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _write(self, batch: list[_Pending]) -> None:
        items = [p.item for p in batch]
        try:
            outcomes: list[Outcome] = list(await self._store(items))
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets its error
            outcomes = [exc] * len(batch)
        finally:
            self._in_flight -= 1
            # What arrived while this batch was written goes next, as one batch.
            self._schedule_flush()
        self.batches += 1
        self.submissions += len(batch)
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.future.done():  # cancelled: nobody waits for it any more
                continue
            if isinstance(outcome, asyncio.CancelledError):  # the server is stopping
                pending.future.cancel()
            elif isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
                # Marked as seen: a caller past its deadline no longer awaits it (and
                # asyncio would log it as never retrieved); one that awaits still gets it.
                pending.future.exception()
            else:
                pending.future.set_result(outcome)
        new = [(p.item, o) for p, o in zip(batch, outcomes, strict=True)
               if isinstance(o, submissions.Stored) and o.created]
        if new and self._on_committed is not None:
            try:
                self._on_committed(new)
            except Exception as exc:  # noqa: BLE001 - after the commit nothing may fail a call
                log.warning("after-commit hook failed: %s", exc)

    async def _store(self, items: list[submissions.Submission]) -> list[Outcome]:
        """The batch in one statement, else (not an outage) each submission alone."""
        try:
            return list(await self._execute(items))
        except psycopg.Error as exc:
            if len(items) == 1:
                raise _domain_error(exc) from exc
            log.info("batch of %d submissions failed (%s); retrying one by one", len(items), exc)
        outcomes: list[Outcome] = []
        for item in items:
            try:
                outcomes += await self._execute([item])
            except psycopg.Error as exc:
                outcomes.append(_domain_error(exc))
        return outcomes

    async def _execute(self, items: list[submissions.Submission]) -> list[submissions.Stored | DomainError]:
        conn = await self._connection()
        try:
            async with asyncio.timeout(BATCH_TIMEOUT_S):
                outcomes = await submissions.store_batch(conn, items)
        except (psycopg.OperationalError, TimeoutError) as exc:
            await _discard(conn)
            raise Unavailable(f"database unavailable: {exc or 'no answer within the batch timeout'}") from exc
        except BaseException:
            await _discard(conn)
            raise
        self._idle.append(conn)
        return outcomes

    async def _connection(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        try:
            return await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                application_name=application_name(self._name),
            )
        except psycopg.OperationalError as exc:
            raise Unavailable(f"database unavailable: {exc}") from exc


async def _discard(conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> None:
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 - already broken
        pass


def _domain_error(exc: psycopg.Error) -> BaseException:
    """A single submission's database error as its status code (never INTERNAL for input)."""
    if isinstance(exc, psycopg.DataError):
        return InvalidArgument("request", f"a value is out of range ({exc})")
    if isinstance(exc, psycopg.IntegrityError):
        # A job id collided, or the tenant was deleted while the job was stored: a retry
        # (UNAVAILABLE is what clients retry) stores it, or names the missing tenant.
        return Unavailable(f"submission conflicted with a concurrent change ({exc.diag.constraint_name}); retry")
    return exc
