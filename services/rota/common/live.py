"""Live state in Redis: a cache of the present that Postgres and the agents can rebuild.

Keys (all under the cluster's prefix):
  {p}:hb:{node}          heartbeat, expires after the node timeout
  {p}:node:{node}        node inventory (JSON), refreshed by every heartbeat
  {p}:placement          hash job id -> committed placement (JSON)
  {p}:events:{job}       stream of the job's events (state changes, progress)
  {p}:wake               pub/sub channel: work for the allocator (rota.allocator.wakeups)
Every call has socket timeouts: a lost Redis makes calls fail fast, never hang.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import redis

from rota.common import metrics

EVENT_STREAM_MAXLEN = 1000


def connect_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True, health_check_interval=30
    )


class LiveState:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # Nodes and heartbeats.
    def record_heartbeat(self, node: str, inventory: dict[str, Any], ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._key("hb", node), "1", px=ttl_ms)
        pipe.set(self._key("node", node), json.dumps(inventory))
        pipe.execute()

    def node_alive(self, node: str) -> bool:
        return bool(self.client.exists(self._key("hb", node)))

    def node_inventory(self, node: str) -> dict[str, Any] | None:
        raw = self.client.get(self._key("node", node))
        return json.loads(str(raw)) if raw else None

    # The current placement.
    def set_placement(self, job_id: str, node: str, gpus: list[int], epoch: int) -> None:
        value = json.dumps({"node": node, "gpus": gpus, "epoch": epoch})
        self.client.hset(self._key("placement"), job_id, value)

    def clear_placement(self, job_id: str) -> None:
        self.client.hdel(self._key("placement"), job_id)

    def placements(self) -> dict[str, dict[str, Any]]:
        raw: dict[str, str] = self.client.hgetall(self._key("placement"))  # type: ignore[assignment]
        return {job: json.loads(value) for job, value in raw.items()}

    def replace_placements(self, placements: dict[str, dict[str, Any]]) -> None:
        """Rebuilds the placement cache from Postgres in one step."""
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self._key("placement"))
        if placements:
            pipe.hset(self._key("placement"), mapping={k: json.dumps(v) for k, v in placements.items()})
        pipe.execute()

    # Job events.
    def publish_job_events(self, items: list[tuple[str, str, dict[str, Any]]], *, wake: bool = False) -> None:
        """Many (job id, event, payload) in one round trip (a batch of submissions); with
        `wake`, the same trip wakes the allocator (there is work for it)."""
        pipe = self.client.pipeline(transaction=False)
        for job_id, event, payload in items:
            fields = {"event": event, "payload": json.dumps(payload)}
            pipe.xadd(self._key("events", job_id), fields, maxlen=EVENT_STREAM_MAXLEN)  # type: ignore[arg-type]
        if wake:
            pipe.publish(self.wake_channel, "1")
        pipe.execute()

    @property
    def wake_channel(self) -> str:
        return self._key("wake")

    def read_job_events(
        self, job_id: str, last_id: str, block_ms: int
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """Events after `last_id` ("$" = only new ones), waiting at most block_ms."""
        result: Any = self.client.xread({self._key("events", job_id): last_id}, block=block_ms, count=100)
        events: list[tuple[str, str, dict[str, Any]]] = []
        for _stream, entries in result or []:
            for entry_id, fields in entries:
                events.append((entry_id, fields["event"], json.loads(fields["payload"])))
        return events

    def last_event_id(self, job_id: str) -> str:
        entries = self.client.xrevrange(self._key("events", job_id), count=1)
        return str(entries[0][0]) if entries else "0-0"  # type: ignore[index]


def _counting_errors(name: str, method: Any) -> Any:
    @functools.wraps(method)
    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except redis.RedisError:
            metrics.REDIS_ERRORS.labels(operation=name).inc()
            raise

    return counted


# Every Redis call of every process goes through LiveState: its failures are counted here,
# once, by operation (rota_redis_errors_total), whatever each caller then does about them.
for _name, _method in list(vars(LiveState).items()):
    if callable(_method) and not _name.startswith("_"):
        setattr(LiveState, _name, _counting_errors(_name, _method))
