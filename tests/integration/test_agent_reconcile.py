"""The agent's heartbeat reconciliation against its own process table, with real processes:
a reply that predates a launch must not stop what that launch started."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.main import Heartbeats
from rota.agent.processes import ProcessTable
from rota.agent.service import AgentRuntime
from rota.common.config import Settings
from rota.imagestore.settings import CheckpointSettings
from rota.v1 import api_pb2

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


class WatchedLock(asyncio.Lock):
    """The runtime's lock, telling when someone has to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> bool:
        if self.locked():
            self.contended.set()  # this caller is about to queue for the lock
        return await super().acquire()


def test_a_stale_reply_stops_only_the_copy_it_judged_not_a_newer_launch_of_the_same_job(tmp_path: Path) -> None:
    home = tmp_path / "agent"
    home.mkdir()
    (home / "lease").touch()
    table = ProcessTable("node-a", home, home / "lease", 60)
    runtime = AgentRuntime("node-a", table, virtual=True,
                           checkpoints=AgentCheckpoints("node-a", table, home, CheckpointSettings.from_env(home)))
    runtime.lock = lock = WatchedLock()

    async def scenario() -> int | None:
        heartbeats = Heartbeats(Settings(admin_token="t", api_addr="127.0.0.1:9"), runtime, "127.0.0.1:10", [])
        table.launch("j-1", 2, [0], SLEEP, "", {}, True)
        sent_at = time.monotonic()  # the heartbeat leaves while epoch 2 runs ...
        reply = api_pb2.NodeHeartbeatResponse()  # ... and its reply says: nothing placed here (paused)
        async with runtime.lock:  # a launch of the resumed job, onto this node, holds the lock
            reconciling = asyncio.create_task(heartbeats.reconcile(reply, sent_at))
            # The reconciliation has judged epoch 2 (stale: stop it) and now waits for the lock.
            await asyncio.wait_for(lock.contended.wait(), timeout=10)
            table.stop("j-1", 2, "paused at a safe point", grace_s=2)
            resumed = table.launch("j-1", 3, [0], SLEEP, "", {}, True)
        await reconciling
        await heartbeats.close()
        return resumed.exit_code()

    try:
        assert asyncio.run(scenario()) is None  # epoch 3 still runs
        assert table.jobs["j-1"].epoch == 3 and table.jobs["j-1"].exit_code() is None
    finally:
        table.stop_all("test over", grace_s=2)
