"""A cache for values read on the hot path of every call (a token's tenant, the largest
node's GPUs), kept a short while and refreshed ahead of expiry.

A plain time-to-live cache makes every expiry a stall: each call arriving while the value
is re-read waits for the database, and each of them reads it again. Here, past half its
life an entry still answers at once while one background read refreshes it, and callers
that must wait (nothing cached, or expired) share one read per key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_ENTRIES = 10_000  # keys kept at most (unknown tokens are cached too): the oldest go first


class RefreshAhead(Generic[K, V]):
    def __init__(
        self, load: Callable[[K], Awaitable[V]], ttl_s: float, *,
        clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}  # key -> (when read, value)
        self._loading: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, *, fresh: bool = False) -> V:
        """The value for `key`: cached if younger than the time to live (and `fresh` not
        asked), else read (one read shared by every caller waiting for this key)."""
        entry = self._entries.get(key)
        if entry is not None and not fresh:
            age = self._clock() - entry[0]
            if age < self._ttl_s:
                if age >= self._ttl_s / 2:
                    self._start(key)  # refreshed in the background; this call does not wait
                return entry[1]
        return await asyncio.shield(self._start(key))

    def _start(self, key: K) -> asyncio.Task[V]:
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._read(key))
            self._loading[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        return task

    async def _read(self, key: K) -> V:
        value = await self._load(key)
        self._entries.pop(key, None)  # re-inserted last: the dict stays in age order
        self._entries[key] = (self._clock(), value)
        while len(self._entries) > self._max_entries:
            del self._entries[next(iter(self._entries))]
        return value

    def _done(self, key: K, task: asyncio.Task[V]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()  # a failed background refresh is seen by the next caller's read
