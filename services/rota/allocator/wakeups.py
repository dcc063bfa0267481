"""Cycles on demand: the allocator's pause between cycles ends when work arrives.

The api publishes on the cluster's wake channel (`LiveState.wake_channel`) after it
commits something the allocator acts on: new submissions, a job that finished or failed
and freed its GPUs. A thread holds the subscription (redis-py's pub/sub is blocking) and
sets an asyncio event in the loop. Redis is a cache here as everywhere: while it is down,
flushed or restarting, nothing wakes the allocator early and it cycles on its interval;
the thread subscribes again when Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import redis

log = logging.getLogger(__name__)

POLL_S = 1.0  # the listener checks for close this often while nothing is published
RETRY_S = 1.0  # after Redis failed, before subscribing again


class Wakeups:
    def __init__(self, client: redis.Redis, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._event = asyncio.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.received = 0  # wake-ups seen, for tests and logs

    def start(self) -> None:
        """Subscribes in a daemon thread; call from the event loop that will wait."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._listen, name="allocator-wakeups", daemon=True)
        self._thread.start()

    async def wait(self, timeout_s: float) -> bool:
        """True when woken within `timeout_s` (the wake-up is consumed), else False."""
        if self._thread is None:
            self.start()
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    def close(self, wait_s: float = 0.0) -> None:
        """The listener ends within POLL_S; `wait_s` > 0 waits that long for it (before the
        Redis client it uses is closed)."""
        self._closed.set()
        if wait_s > 0 and self._thread is not None:
            self._thread.join(wait_s)

    def _listen(self) -> None:
        while not self._closed.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self._channel)
                while not self._closed.is_set():
                    if pubsub.get_message(timeout=POLL_S) is not None:
                        self._woken()
            except Exception as exc:  # noqa: BLE001 - the listener must outlive any Redis failure
                log.debug("wake-up subscription lost (%s); cycling on the interval until Redis is back", exc)
                self._closed.wait(RETRY_S)
            finally:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001,S110 - a connection already gone
                    pass

    def _woken(self) -> None:
        self.received += 1
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._event.set)
