"""The scheduling loop: snapshot -> place -> commit -> tell the agents, every interval.

Only the leader runs cycles: it holds a Postgres advisory lock on a dedicated connection,
so a second allocator (or a crashed one's replacement) waits instead of double-booking;
and every placement is committed with a fresh fencing epoch before any agent hears of it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import Connection, Engine, text

from rota.allocator import repository
from rota.allocator.placement import place_fifo
from rota.common import convert
from rota.common.agents import AgentClients
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.errors import Unavailable
from rota.common.jobs_repo import Events
from rota.common.live import LiveState
from rota.v1 import agent_pb2

log = logging.getLogger(__name__)
LEADER_LOCK_KEY = 0x526F7461  # "Rota"


class Leadership:
    """Session-level advisory lock: released by Postgres when our connection dies."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

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
    waiting: int = 0
    dead_nodes: int = 0
    led: bool = False


class SchedulingLoop:
    def __init__(self, settings: Settings, db: Database, live: LiveState, agents: AgentClients) -> None:
        self.settings = settings
        self.db = db
        self.live = live
        self.agents = agents
        self.leadership = Leadership(db.engine)
        self._api_channel: grpc.aio.Channel | None = None
        self._api_health: health_pb2_grpc.HealthStub | None = None

    async def run_forever(self) -> None:
        while True:
            try:
                await self.cycle()
            except Unavailable as exc:
                log.warning("cycle skipped: %s", exc)
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad cycle
                log.exception("scheduling cycle failed")
            await asyncio.sleep(self.settings.schedule_interval_s)

    async def cycle(self) -> CycleReport:
        report = CycleReport()
        # 1. Lead, or wait for the leader's lock to be released.
        if not await asyncio.to_thread(self.leadership.ensure):
            return report
        report.led = True
        events = Events()
        # 2. Nodes silent past the timeout are dead; their jobs lost and handled. Only while
        #    the api (which receives heartbeats) is up: its outage must not read as deaths.
        if await self._api_serving():
            dead = await asyncio.to_thread(
                self.db.run, lambda s: repository.mark_dead_nodes(s, self.settings.node_timeout_s, events)
            )
            report.dead_nodes = len(dead)
        # 3. Snapshot of free GPUs and the queue; 4. the pure FIFO core decides.
        snap = await asyncio.to_thread(self.db.run, repository.snapshot)
        result = place_fifo(snap.nodes, snap.queue)
        # 5. Commit each placement in its own transaction, under a new epoch.
        launches: list[tuple[str, agent_pb2.LaunchRequest]] = []
        for decision in result.decisions:
            request = await asyncio.to_thread(self.db.run, lambda s, d=decision: self._commit(s, d, events))
            if request is not None:
                launches.append((snap.addresses[decision.node], request))
        report.placed = len(launches)
        report.waiting = len(result.waiting)
        await asyncio.to_thread(self.db.run, lambda s: repository.set_waiting_reasons(s, result.waiting))
        # 6. After the commits: refresh the cache, publish events, tell the agents.
        await asyncio.to_thread(self._refresh_cache, events)
        await asyncio.gather(*(self._launch(address, request) for address, request in launches))
        return report

    async def _api_serving(self) -> bool:
        if self._api_health is None:
            self._api_channel = grpc.aio.insecure_channel(self.settings.api_addr)
            self._api_health = health_pb2_grpc.HealthStub(self._api_channel)
        try:
            reply = await self._api_health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    @staticmethod
    def _commit(session, decision, events: Events) -> agent_pb2.LaunchRequest | None:  # type: ignore[no-untyped-def]
        job = repository.commit_decision(session, decision, events)
        if job is None:
            return None
        return agent_pb2.LaunchRequest(job=convert.job_to_proto(job), epoch=job.epoch)

    def _refresh_cache(self, events: Events) -> None:
        try:
            holding = self.db.run(lambda s: repository.snapshot(s).holding)
            self.live.replace_placements(
                {j.id: {"node": j.node, "gpus": list(j.gpu_indices), "epoch": j.epoch} for j in holding}
            )
            for job_id, event, payload in events.items:
                self.live.publish_job_event(job_id, event, payload)
        except Exception as exc:  # noqa: BLE001 - Redis is a cache; Postgres has it all
            log.warning("live state refresh failed: %s", exc)

    async def _launch(self, address: str, request: agent_pb2.LaunchRequest) -> None:
        try:
            await self.agents.stub(address).Launch(request, timeout=10, metadata=self.agents.metadata)
        except grpc.aio.AioRpcError as exc:
            # The agent's next heartbeat lists this assignment and it launches it then.
            log.warning("launch of %s at %s failed (%s): reconciliation will retry", request.job.id, address, exc.code())
