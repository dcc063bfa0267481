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

    async def __call__(self, key: str) -> str:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("database down")
        return f"{key}:{self.value}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def build(ttl_s: float = 10.0, max_entries: int = 100) -> tuple[RefreshAhead[str, str], Loader, Clock]:
    loader, clock = Loader(), Clock()
    return RefreshAhead(loader, ttl_s, clock=clock, max_entries=max_entries), loader, clock


async def settle() -> None:
    for _ in range(3):  # lets background reads run to completion
        await asyncio.sleep(0)


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
        await settle()
        assert loader.reads == 2  # one refresh for both calls
        loader.gate.set()
        await settle()
        assert await cache.get("a") == "a:v2" and loader.reads == 2

    asyncio.run(run())


def test_callers_of_an_expired_entry_share_one_read() -> None:
    async def run() -> None:
        cache, loader, clock = build()
        await cache.get("a")
        clock.now += 11.0
        loader.value, loader.gate = "v2", asyncio.Event()
        waiting = [asyncio.create_task(cache.get("a")) for _ in range(5)]
        await settle()
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
        await settle()
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
