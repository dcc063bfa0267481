"""An agent's heartbeats against an api that does not answer (a closed port): quiet while
the agent starts beside an api not yet listening, a warning once that is an outage."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from rota.agent import main as agent_main
from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.main import Heartbeats
from rota.agent.processes import ProcessTable
from rota.agent.service import AgentRuntime
from rota.common.config import Settings
from rota.imagestore.settings import CheckpointSettings
from rota.operator.localcluster import free_port


def heartbeats(tmp_path: Path) -> Heartbeats:
    home = tmp_path / "agent"
    home.mkdir()
    table = ProcessTable("node-a", home, home / "lease", 60)
    runtime = AgentRuntime("node-a", table, virtual=True,
                           checkpoints=AgentCheckpoints("node-a", table, home, CheckpointSettings.from_env(home)))
    api = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = Settings(admin_token="t", api_addr=api, api_node_addr=api, heartbeat_interval_s=0.2)
    return Heartbeats(settings, runtime, "127.0.0.1:10", [])


async def beat_for(beats: Heartbeats, seconds: float) -> None:
    loop = asyncio.create_task(beats.run_forever())
    await asyncio.sleep(seconds)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop


def failures(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.levelno for r in caplog.records if r.getMessage().startswith("heartbeat failed: UNAVAILABLE")]


def test_an_api_not_up_yet_is_retried_quietly_then_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="rota.agent")

    async def scenario() -> None:
        beats = heartbeats(tmp_path)
        await beat_for(beats, 0.6)  # a normal start: the api is not listening yet
        assert failures(caplog) and set(failures(caplog)) == {logging.DEBUG}
        caplog.clear()
        monkeypatch.setattr(agent_main, "STARTUP_GRACE_S", 0.0)  # the grace has passed: an outage
        await beat_for(beats, 0.6)
        assert failures(caplog) and set(failures(caplog)) == {logging.WARNING}
        caplog.clear()
        monkeypatch.setattr(agent_main, "STARTUP_GRACE_S", 3600.0)
        beats.reached = True  # the api answered once: it going away is an outage at once
        await beat_for(beats, 0.6)
        assert failures(caplog) and set(failures(caplog)) == {logging.WARNING}
        await beats.close()

    asyncio.run(scenario())
