"""A realtime app on one node as real processes: one per replica, each on its own GPU; a
resize starts and stops only the replicas that change, and answers once the removed ones are gone."""

from __future__ import annotations

import json
from pathlib import Path

from test_agent_processes import PY, pid_alive, tables, wait_exit, wait_until  # noqa: F401 - the fixture

from rota.agent.processes import ProcessTable, applied_replicas

# Each replica writes who it is, then reports a growing `served` every 0.1 s.
REPLICA = """
import json, os, sys, time
gpu = os.environ["ROTA_REPLICA_GPU"]
keys = ("ROTA_REPLICA_INDEX", "ROTA_GPUS", "CUDA_VISIBLE_DEVICES")
info = {"pid": os.getpid(), **{k: os.environ.get(k) for k in keys}}
open(os.path.join(os.environ["OUT"], gpu + ".json"), "w").write(json.dumps(info))
if gpu == os.environ.get("FAIL_ON", ""):
    sys.exit(4)
served = 0
while True:
    served += 10
    with open(os.environ["ROTA_PROGRESS_FILE"], "a") as f:
        f.write(json.dumps({"served": served, "replicas": 1}) + "\\n")
    time.sleep(0.1)
"""


def replicas_seen(out: Path) -> dict[int, dict[str, str]]:
    """GPU -> what its live replica process wrote."""
    found = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    return {g: info for g, info in found.items() if pid_alive(int(info["pid"]))}


def start(table: ProcessTable, out: Path, epoch: int, gpus: list[int], *, virtual: bool = True, **env: str):  # type: ignore[no-untyped-def]
    job = table.launch("j-app", epoch, gpus, [PY, "-c", REPLICA], "", {"OUT": str(out), **env}, virtual, replicas=True)
    assert wait_until(lambda: sorted(replicas_seen(out)) == sorted(gpus), 20), replicas_seen(out)
    return job


def test_each_replica_is_a_process_on_its_own_gpu_and_a_resize_keeps_those_that_stay(
    tables, tmp_path: Path,  # noqa: F811 - the fixture
) -> None:
    table = tables.new()
    out = tmp_path / "out"
    out.mkdir()
    job = start(table, out, 5, [0, 1])
    first = replicas_seen(out)
    assert {g: (i["ROTA_GPUS"], i["CUDA_VISIBLE_DEVICES"]) for g, i in first.items()} == {0: ("0", ""), 1: ("1", "")}
    assert sorted(i["ROTA_REPLICA_INDEX"] for i in first.values()) == ["0", "1"]
    # The node's progress: the replicas' `served` summed, `replicas` the count running.
    assert wait_until(lambda: json.loads(job.progress_json() or "{}").get("replicas") == 2)
    # A resize to GPUs 1 and 2: replica 0 is stopped before the resize answers, 1 runs on, 2 starts.
    table.resize("j-app", 6, [1, 2])
    assert applied_replicas(job.folder) == (6, [1, 2])
    assert not pid_alive(int(first[0]["pid"]))
    assert wait_until(lambda: sorted(replicas_seen(out)) == [1, 2], 20)
    now = replicas_seen(out)
    assert now[1]["pid"] == first[1]["pid"] and now[2]["ROTA_REPLICA_INDEX"] == "0"  # the index replica 0 left
    served = json.loads(job.progress_json())["served"]
    assert wait_until(lambda: json.loads(job.progress_json())["served"] > served)
    # Another job placed on GPU 2 under a newer epoch (before the app's own resize came):
    # only that replica goes, the app runs on.
    other = table.launch("j-other", 7, [2], [PY, "-c", "import time; time.sleep(30)"], "", {}, True)
    assert sorted(replicas_seen(out)) == [1] and job.exit_code() is None and job.gpus == [1]
    table.stop("j-other", 0, "test over", grace_s=2)
    wait_exit(other)
    table.stop("j-app", 0, "test over", grace_s=2)
    assert wait_exit(job) != 0 and not replicas_seen(out)


def test_real_gpus_are_pinned_one_per_replica_and_one_failure_ends_the_set(
    tables, tmp_path: Path,  # noqa: F811 - the fixture
) -> None:
    table = tables.new()
    out = tmp_path / "out"
    out.mkdir()
    job = table.launch("j-app", 3, [2, 3], [PY, "-c", REPLICA], "", {"OUT": str(out), "FAIL_ON": "3"}, False,
                       replicas=True)
    assert wait_exit(job, 20) == 4  # the first failure's code
    seen = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {g: i["CUDA_VISIBLE_DEVICES"] for g, i in seen.items()} == {2: "2", 3: "3"}
    assert not replicas_seen(out)  # the healthy replica was stopped with it
