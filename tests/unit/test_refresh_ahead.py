"""The refresh-ahead cache behind token and largest-node lookups: an injected clock, a
loader that counts its reads and can be held mid-read; no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from rota.common.refresh import RefreshAhead


class Loader:
    def __init__(self) -> None:
        self.reads = 0
        self.value = "v1"
        self.gate: asyncio.Event | None = None  # set: reads wait for it
        self.fail = False
        self._began = asyncio.Condition()

    async def __call__(self, key: str) -> str:
        self.reads += 1
        async with self._began:
            self._began.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("database down")
        return f"{key}:{self.value}"

    async def started(self, reads: int) -> None:
        """Returns once `reads` reads have begun (a background one included)."""
        async with self._began:
            await self._began.wait_for(lambda: self.reads >= reads)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def build(ttl_s: float = 10.0, max_entries: int = 100) -> tuple[RefreshAhead[str, str], Loader, Clock]:
    loader, clock = Loader(), Clock()
    return RefreshAhead(loader, ttl_s, clock=clock, max_entries=max_entries), loader, clock


async def background_done() -> None:
    """Returns once every other task (the cache's background reads) has ended, whatever
    its outcome; the cache's own done-callbacks have run by then."""
    await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)


def test_a_young_entry_answers_without_reading_again() -> None:
    async def run() -> None:
        cache, loader, clock = build()
        assert await cache.get("a") == "a:v1"
        clock.now += 4.0
        loader.value = "v2"
        assert await cache.get("a") == "a:v1"
        assert loader.reads == 1

    asyncio.run(run())


def test_past_half_its_life_an_entry_answers_at_once_and_is_refreshed_in_the_background() -> None:
    async def run() -> None:
        cache, loader, clock = build()
        await cache.get("a")
        clock.now += 6.0
        loader.value = "v2"
        loader.gate = asyncio.Event()  # the refresh cannot finish yet
        assert await cache.get("a") == "a:v1"  # did not wait for it
        assert await cache.get("a") == "a:v1"
        await loader.started(2)
        assert loader.reads == 2
        loader.gate.set()
        await background_done()
        assert await cache.get("a") == "a:v2" and loader.reads == 2  # one refresh for both calls

    asyncio.run(run())


def test_callers_of_an_expired_entry_share_one_read() -> None:
    async def run() -> None:
        cache, loader, clock = build()
        await cache.get("a")
        clock.now += 11.0
        loader.value, loader.gate = "v2", asyncio.Event()
        waiting = [asyncio.create_task(cache.get("a")) for _ in range(5)]
        await loader.started(2)  # every caller has asked by then: the read began after them
        assert not any(t.done() for t in waiting)  # an expired entry is never answered
        loader.gate.set()
        assert await asyncio.gather(*waiting) == ["a:v2"] * 5
        assert loader.reads == 2

    asyncio.run(run())


def test_asking_for_a_fresh_value_reads_even_a_young_entry() -> None:
    async def run() -> None:
        cache, loader, _clock = build()
        await cache.get("a")
        loader.value = "v2"
        assert await cache.get("a", fresh=True) == "a:v2" and loader.reads == 2

    asyncio.run(run())


def test_a_failed_read_reaches_the_caller_and_the_next_call_reads_again() -> None:
    async def run() -> None:
        cache, loader, _clock = build()
        loader.fail = True
        with pytest.raises(ConnectionError):
            await cache.get("a")
        loader.fail = False
        assert await cache.get("a") == "a:v1" and loader.reads == 2

    asyncio.run(run())


def test_a_failed_background_refresh_keeps_the_entry_until_it_expires() -> None:
    async def run() -> None:
        cache, loader, clock = build()
        await cache.get("a")
        clock.now += 6.0
        loader.fail = True
        assert await cache.get("a") == "a:v1"
        await background_done()
        assert loader.reads == 2
        assert await cache.get("a") == "a:v1"  # still young enough
        clock.now += 5.0
        with pytest.raises(ConnectionError):
            await cache.get("a")

    asyncio.run(run())


def test_past_its_size_the_cache_forgets_the_entries_read_longest_ago() -> None:
    async def run() -> None:
        cache, loader, _clock = build(max_entries=2)
        for key in ("a", "b", "c"):
            await cache.get(key)
        assert loader.reads == 3
        await cache.get("c")
        await cache.get("b")
        assert loader.reads == 3
        await cache.get("a")  # forgotten: read again
        assert loader.reads == 4

    asyncio.run(run())
