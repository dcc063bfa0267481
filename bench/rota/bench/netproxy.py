"""A TCP proxy that injects network faults between two Rota parts, in user space.

It stands where `tc netem` in a network namespace would (that needs privileges this
suite cannot assume): every byte passes through it, so it can add delay with jitter to
each chunk, or cut the link (close every connection and refuse new ones) and heal it.
The upstream is a TCP `host:port` or a Unix socket path (an embedded PostgreSQL).
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field


@dataclass
class FaultProxy:
    upstream: str  # "host:port" or a Unix socket path
    delay_s: float = 0.0
    jitter_s: float = 0.0
    port: int = 0
    _cut: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.AbstractServer | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _rng: random.Random = field(default_factory=lambda: random.Random(7))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def cut(self) -> None:
        """The link goes down: open connections drop, new ones are refused until `heal`."""
        self._cut = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drop_all)

    def heal(self) -> None:
        self._cut = False

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            if ":" in self.upstream and not self.upstream.startswith("/"):
                host, port = self.upstream.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            else:
                up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.delay_s or self.jitter_s:
                    await asyncio.sleep(max(0.0, self.delay_s + self._rng.uniform(-self.jitter_s, self.jitter_s)))
                if self._cut:
                    break
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()
