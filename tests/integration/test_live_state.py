"""Live state on a real Redis: heartbeat TTLs, the placement cache and job event streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from rota.common.live import EVENT_STREAM_MAXLEN, LiveState, connect_redis


@pytest.fixture
def live(redis_url: str, redis_prefix: str) -> Iterator[LiveState]:
    client = connect_redis(redis_url)
    yield LiveState(client, redis_prefix)
    keys = list(client.scan_iter(match=f"{redis_prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def wait_until(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_heartbeat_expires_after_its_ttl(live: LiveState) -> None:
    inventory = {"node": "n1", "gpus": 4, "jobs": ["j-1"]}
    live.record_heartbeat("n1", inventory, ttl_s=0.3)
    assert live.node_alive("n1")
    assert live.node_inventory("n1") == inventory
    assert 0 < live.client.pttl(f"{live.prefix}:hb:n1") <= 300
    assert wait_until(lambda: not live.node_alive("n1"), timeout=3.0)
    # The inventory outlives the heartbeat: it describes the node, not its liveness.
    assert live.node_inventory("n1") == inventory


def test_a_new_heartbeat_extends_the_ttl(live: LiveState) -> None:
    live.record_heartbeat("n1", {}, ttl_s=0.3)
    live.record_heartbeat("n1", {"v": 2}, ttl_s=30)
    time.sleep(0.4)
    assert live.node_alive("n1")
    assert live.node_inventory("n1") == {"v": 2}


def test_unknown_node(live: LiveState) -> None:
    assert not live.node_alive("nobody")
    assert live.node_inventory("nobody") is None


def test_placement_cache_set_clear_replace(live: LiveState) -> None:
    assert live.placements() == {}
    live.set_placement("j-1", "n1", [0, 1], 7)
    live.set_placement("j-2", "n2", [3], 8)
    assert live.placements() == {
        "j-1": {"node": "n1", "gpus": [0, 1], "epoch": 7},
        "j-2": {"node": "n2", "gpus": [3], "epoch": 8},
    }
    live.set_placement("j-1", "n3", [2], 9)  # a newer placement overwrites
    assert live.placements()["j-1"] == {"node": "n3", "gpus": [2], "epoch": 9}
    live.clear_placement("j-2")
    live.clear_placement("j-absent")
    assert set(live.placements()) == {"j-1"}

    live.replace_placements({"j-5": {"node": "n1", "gpus": [0], "epoch": 11}})
    assert live.placements() == {"j-5": {"node": "n1", "gpus": [0], "epoch": 11}}
    live.replace_placements({})
    assert live.placements() == {}


def test_prefixes_isolate_clusters(live: LiveState) -> None:
    other = LiveState(live.client, live.prefix + "-other")
    live.set_placement("j-1", "n1", [0], 1)
    live.record_heartbeat("n1", {}, ttl_s=30)
    assert other.placements() == {} and not other.node_alive("n1")


def test_event_stream_publish_and_read(live: LiveState) -> None:
    assert live.last_event_id("j-1") == "0-0"
    assert live.read_job_events("j-1", "0-0", block_ms=50) == []
    live.publish_job_events([("j-1", "state", {"state": "PENDING"})])
    live.publish_job_events([("j-1", "progress", {"progress": {"step": 1, "loss": 2.5}})])
    live.publish_job_events([("j-2", "state", {"state": "RUNNING"})])
    events = live.read_job_events("j-1", "0-0", block_ms=50)
    assert [(e[1], e[2]) for e in events] == [
        ("state", {"state": "PENDING"}),
        ("progress", {"progress": {"step": 1, "loss": 2.5}}),
    ]
    assert live.last_event_id("j-1") == events[-1][0]
    # Reading after the last id returns only what came later.
    assert live.read_job_events("j-1", events[0][0], block_ms=50) == events[1:]
    assert live.read_job_events("j-1", events[-1][0], block_ms=50) == []


def test_blocking_read_times_out_empty(live: LiveState) -> None:
    live.publish_job_events([("j-1", "state", {"state": "PENDING"})])
    started = time.monotonic()
    assert live.read_job_events("j-1", live.last_event_id("j-1"), block_ms=200) == []
    assert 0.15 <= time.monotonic() - started < 3.0


def test_blocking_read_wakes_on_a_new_event(live: LiveState, redis_url: str) -> None:
    publisher = LiveState(connect_redis(redis_url), live.prefix)
    timer = threading.Timer(0.2, lambda: publisher.publish_job_events([("j-1", "state", {"state": "RUNNING"})]))
    timer.start()
    try:
        started = time.monotonic()
        events = live.read_job_events("j-1", "$", block_ms=4000)
        assert [(e[1], e[2]) for e in events] == [("state", {"state": "RUNNING"})]
        assert time.monotonic() - started < 3.5
    finally:
        timer.join(timeout=5)
        publisher.client.close()


def test_event_stream_is_capped(live: LiveState) -> None:
    published = 3 * EVENT_STREAM_MAXLEN
    for i in range(published):
        live.publish_job_events([("j-1", "progress", {"step": i})])
    length = live.client.xlen(f"{live.prefix}:events:j-1")
    # Trimming may be approximate (whole stream nodes), but the stream stays bounded.
    assert EVENT_STREAM_MAXLEN <= length < 2 * EVENT_STREAM_MAXLEN
    # The newest events are the ones kept.
    [(_id, fields)] = live.client.xrevrange(f"{live.prefix}:events:j-1", count=1)
    assert _id == live.last_event_id("j-1") and f'"step": {published - 1}' in fields["payload"]


def test_lost_redis_fails_fast() -> None:
    client = connect_redis("redis://127.0.0.1:1/0")
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        LiveState(client, "x").node_alive("n1")
    assert time.monotonic() - started < 6
