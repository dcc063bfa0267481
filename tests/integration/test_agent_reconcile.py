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
from rota.v1 import node_pb2

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


def _agent(tmp_path: Path) -> tuple[ProcessTable, AgentRuntime]:
    """A node's process table and runtime on a fresh home, its lease fresh for a minute."""
    home = tmp_path / "agent"
    home.mkdir()
    (home / "lease").touch()
    table = ProcessTable("node-a", home, home / "lease", 60)
    return table, AgentRuntime("node-a", table, virtual=True,
                               checkpoints=AgentCheckpoints("node-a", table, home, CheckpointSettings.from_env(home)))


def test_a_stale_reply_stops_only_the_copy_it_judged_not_a_newer_launch_of_the_same_job(tmp_path: Path) -> None:
    table, runtime = _agent(tmp_path)
    runtime.lock = lock = WatchedLock()

    async def scenario() -> int | None:
        heartbeats = Heartbeats(Settings(admin_token="t", api_addr="127.0.0.1:9"), runtime, "127.0.0.1:10", [])
        table.launch("j-1", 2, [0], SLEEP, "", {}, True)
        sent_at = time.monotonic()  # the heartbeat leaves while epoch 2 runs ...
        reply = node_pb2.NodeServiceHeartbeatResponse()  # ... and its reply says: nothing placed here (paused)
        async with runtime.lock:  # a launch of the resumed job, onto this node, holds the lock
            reconciling = asyncio.create_task(heartbeats.reconcile(reply, sent_at))
            # The reconciliation has judged epoch 2 (stale: stop it) and now waits for the lock.
            await asyncio.wait_for(lock.contended.wait(), timeout=10)
            table.stop("j-1", 2, "paused at a safe point", grace_s=2)
            resumed = table.launch("j-1", 3, [0], SLEEP, "", {}, True)
        await reconciling
        await heartbeats.settle()  # the stop it started (in the background) has run
        await heartbeats.close()
        return resumed.exit_code()

    try:
        assert asyncio.run(scenario()) is None  # epoch 3 still runs
        assert table.jobs["j-1"].epoch == 3 and table.jobs["j-1"].exit_code() is None
    finally:
        table.stop_all("test over", grace_s=2)


STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]


def test_a_job_slow_to_stop_does_not_hold_up_the_heartbeat_loop(tmp_path: Path) -> None:
    # The loop that beats also reconciles: were it to wait out a stop's grace, beats would
    # pause (the node could be declared dead) and nothing could renew the lease.
    table, runtime = _agent(tmp_path)

    async def scenario() -> tuple[int | None, int | None]:
        heartbeats = Heartbeats(Settings(admin_token="t", api_addr="127.0.0.1:9"), runtime, "127.0.0.1:10", [])
        job = table.launch("j-2", 5, [0], STUBBORN, "", {}, True)
        while not _ignores_sigterm(job.pgid):
            await asyncio.sleep(0.02)  # until the job ignores SIGTERM (before, SIGTERM would end it)
        await heartbeats.reconcile(node_pb2.NodeServiceHeartbeatResponse(), time.monotonic() + 1)  # nothing placed here
        running_after_reconcile = job.exit_code()
        await heartbeats.settle()  # the stop: SIGTERM ignored, SIGKILL after the grace
        await heartbeats.close()
        return running_after_reconcile, job.exit_code()

    try:
        during, after = asyncio.run(scenario())
        assert during is None  # reconcile returned while the stop still waited
        assert after is not None
    finally:
        table.stop_all("test over", grace_s=1)


def _ignores_sigterm(pgid: int) -> bool:
    """Whether the launcher's child (the job; the launcher leads the group) ignores SIGTERM (/proc's SigIgn)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pgid):
            return bool(int(fields.get("SigIgn", "0").strip(), 16) & (1 << (15 - 1)))  # signal 15's bit
    return False
