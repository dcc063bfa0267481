"""The allocator's wake-ups on a real Redis: the api's publications end the pause between
cycles early; without one the pause lasts its interval; a lost subscription comes back."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator

import pytest
import redis

from rota.allocator.loop import SchedulingLoop
from rota.allocator.peers import Peers
from rota.allocator.wakeups import Wakeups
from rota.common.agents import AgentClients
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis

SUBSCRIBED_WITHIN_S = 10.0
LONG_S = 30.0  # a pause that only a wake-up ends within the tests' waits


@pytest.fixture
def live(redis_url: str) -> Iterator[LiveState]:
    client = connect_redis(redis_url)
    yield LiveState(client, "rota-test-" + secrets.token_hex(4))
    client.close()


@pytest.fixture
def wakeups(live: LiveState) -> Iterator[Wakeups]:
    listener = Wakeups(live.client, live.wake_channel)
    yield listener
    listener.close(wait_s=5)  # before the fixture above closes the client it reads


async def listening(wakeups: Wakeups, live: LiveState) -> None:
    """Starts the listener in this event loop and waits until it has subscribed."""
    wakeups.start()
    await asyncio.to_thread(subscribed, live.client, live.wake_channel)


def subscribed(client: redis.Redis, channel: str) -> None:
    """Waits until the listener's subscription is in place (publications before it are lost)."""
    deadline = time.monotonic() + SUBSCRIBED_WITHIN_S
    while dict(client.pubsub_numsub(channel)).get(channel, 0) < 1:
        assert time.monotonic() < deadline, "the listener never subscribed"
        time.sleep(0.02)


def test_a_publication_ends_the_wait_and_is_consumed(live: LiveState, wakeups: Wakeups) -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        await listening(wakeups, live)
        quiet = await wakeups.wait(0.1)
        await asyncio.to_thread(live.publish_job_events, [("j-1", "state", {"state": "PENDING"})], wake=True)
        woken = await wakeups.wait(LONG_S)
        again = await wakeups.wait(0.1)  # the one wake-up was consumed
        return quiet, woken, again

    assert asyncio.run(scenario()) == (False, True, False)
    assert wakeups.received == 1


def test_events_without_wake_do_not_wake(live: LiveState, wakeups: Wakeups) -> None:
    async def scenario() -> bool:
        await listening(wakeups, live)
        await asyncio.to_thread(live.publish_job_events, [("j-1", "progress", {"step": 3})])
        return await wakeups.wait(0.3)

    assert asyncio.run(scenario()) is False
    assert live.client.xlen(f"{live.prefix}:events:j-1") == 1  # the event itself went out


def test_a_killed_subscription_is_made_again(live: LiveState, wakeups: Wakeups) -> None:
    async def scenario() -> bool:
        await listening(wakeups, live)
        live.client.client_kill_filter(_type="pubsub")  # as a Redis restart would
        # Publications while the listener subscribes again are lost (it cycles on its
        # interval meanwhile): publish until one gets through.
        deadline = time.monotonic() + SUBSCRIBED_WITHIN_S
        while time.monotonic() < deadline:
            live.client.publish(live.wake_channel, "1")
            if await wakeups.wait(0.2):
                return True
        return False

    assert asyncio.run(scenario()) is True


def test_a_wake_up_ends_the_allocators_pause_between_cycles(live: LiveState, wakeups: Wakeups, private_db: Database) -> None:
    settings = Settings(schedule_interval_s=LONG_S, api_addr="127.0.0.1:1")
    loop = SchedulingLoop(settings, private_db, live, AgentClients("token"), Peers.from_settings(settings), wakeups=wakeups)

    async def scenario() -> None:
        await listening(wakeups, live)
        pause = asyncio.create_task(loop._pause())
        await asyncio.sleep(0.05)
        live.client.publish(live.wake_channel, "1")
        await asyncio.wait_for(pause, LONG_S / 3)  # over long before its interval

    try:
        asyncio.run(scenario())
    finally:
        loop.leadership.release()
