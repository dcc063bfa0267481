"""The agent's rank group (a gang's part on one node) as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rota.agent.processes import RANKGROUP, GangLaunch

GANG = GangLaunch(nodes=("a", "b"), node_rank=1, ranks_per_node=2, master_addr="10.0.0.1", master_port=23456)


def test_each_local_rank_gets_torchruns_variables(tmp_path: Path) -> None:
    script = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[1:]}, "
              "open(os.path.join(os.environ['OUT'], os.environ['LOCAL_RANK'] + '.json'), 'w'))")
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
            "ROTA_PROGRESS_FILE"]
    env = {**GANG.env(), "ROTA_PROGRESS_FILE": "/x/progress.jsonl", "PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}
    done = subprocess.run([*RANKGROUP, "--ranks", "2", "--", sys.executable, "-c", script, *keys], env=env, timeout=60)
    assert done.returncode == 0
    got = [json.loads((tmp_path / f"{i}.json").read_text()) for i in (0, 1)]
    assert [(g["RANK"], g["LOCAL_RANK"]) for g in got] == [("2", "0"), ("3", "1")]
    assert {(g["WORLD_SIZE"], g["NODE_RANK"], g["MASTER_ADDR"], g["MASTER_PORT"], g["LOCAL_WORLD_SIZE"]) for g in got} \
        == {("4", "1", "10.0.0.1", "23456", "2")}
    # One progress voice: local rank 0 writes the agent's file, the other its own.
    assert [g["ROTA_PROGRESS_FILE"] for g in got] == ["/x/progress.jsonl", "/x/progress.jsonl.rank3"]


def test_one_failing_rank_stops_the_others_and_sets_the_exit_code() -> None:
    # Local rank 1 fails at once; rank 0 would sleep for a minute.
    script = "import os, sys, time; sys.exit(7) if os.environ['LOCAL_RANK'] == '1' else time.sleep(60)"
    started = time.monotonic()
    done = subprocess.run([*RANKGROUP, "--ranks", "2", "--", sys.executable, "-c", script],
                          env={**GANG.env(), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert "local rank 1 exited with 7; stopping the other ranks" in done.stderr
    assert time.monotonic() - started < 30  # the sleeper was stopped, not waited for
