"""A service's background tasks are supervised: one that crashes stops the real server (which
then raises, so the process exits non-zero for its supervisor); one that finishes does not."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry import trace

from rota.common.server import BackgroundTaskCrashed, RotaInterceptor, run_server


async def _no_token(token: str) -> None:
    return None


def _serve(background: list) -> None:  # type: ignore[type-arg]
    def register(server: grpc.aio.Server) -> list[str]:
        return []

    interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=_no_token, default_deadline_s=5)
    asyncio.run(asyncio.wait_for(run_server(
        name="test", listen="127.0.0.1:0", register=register, interceptor=interceptor,
        max_message_bytes=1 << 20, background=background, grace_s=0.1,
    ), timeout=30))


def test_a_crashed_background_task_stops_the_service() -> None:
    finished = asyncio.Event()

    async def one_shot() -> None:  # like the checkpoint service's recovery: returns, and that is fine
        finished.set()

    async def crashes() -> None:
        await finished.wait()
        raise RuntimeError("lost the database for good")

    with pytest.raises(BackgroundTaskCrashed, match="crashes"):
        _serve([one_shot, crashes])

