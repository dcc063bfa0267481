"""`rota bench faults [--rounds N] [--json]`: inject faults into a real local cluster.

Cases, each over N rounds of short real jobs (numbered as in the reliability issue):
1. kill -9 the leading allocator at a random point of its cycle; the standby takes over;
2. the cluster's Redis keys flushed mid-run, and its Redis server killed with kill -9 and
   restarted by `rota up` (only a Redis the cluster owns: skipped, with the reason, for a
   --redis-url one): live state rebuilt from Postgres and reports;
3. PostgreSQL unreachable for 10 s (a proxy cuts it off): status codes clients see, recovery;
4. an agent killed with kill -9, and one frozen with SIGSTOP past the node timeout; an
   agent of a running gang's node killed (the whole gang stops and runs again);
5. submissions replayed under client timeouts with one request id;
6. a partition between an agent and the api (a proxy, in place of tc netem): no false
   death under 200 ms of jitter, a death within the node timeout under a real cut;
7. security: no token, a bad token, another tenant's job, a body naming another tenant,
   an oversized message; plaintext and certificate-less clients of a mutual-TLS port;
   every call that names a job or an array (cancel, pause, resume, checkpoint, migrate,
   re-plan apply, explain, logs, the console's POST actions) with another tenant's token.
Cases 3 and 6 are in rota.bench.fault_network, 5 and 7 in rota.bench.fault_requests.
Every case ends with the same checks (see `rota.bench.fault_harness`): lost and duplicated jobs,
double-booked GPUs, two running copies, ledger conservation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import redis

from rota.bench import fault_harness
from rota.bench.fault_harness import (
    GoneTimer,
    Harness,
    Watch,
    alive_pids,
    health_is,
    job_processes,
    percentiles,
    wait_for,
)
from rota.bench.fault_network import partition, postgres_outage
from rota.bench.fault_requests import replays, security
from rota.client import RotaError
from rota.v1 import agent_pb2, agent_pb2_grpc, common_pb2


def allocator_kills(h: Harness, rounds: int, rng: random.Random) -> dict[str, Any]:
    takeovers: list[float] = []
    for _ in range(rounds):
        h.submit(2, seconds=1.0)
        time.sleep(rng.uniform(0.0, 0.6))  # a random point of the leader's cycle
        leader = wait_for(h.leader_pid, 30)
        os.kill(leader, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(new_leader(h, leader), 60)
        takeovers.append(time.monotonic() - killed)
    return {"rounds": rounds, "takeover_s": percentiles(takeovers)}


def redis_flushes(h: Harness, rounds: int, rng: random.Random) -> dict[str, Any]:
    info = h.info
    client = redis.Redis.from_url(info["redis_url"])
    prefix = info["redis_prefix"]
    rebuilt: list[float] = []
    for _ in range(rounds):
        h.submit(2, seconds=1.0)
        time.sleep(rng.uniform(0.0, 0.6))
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        flushed = time.monotonic()
        # Every live node's heartbeat key is back: the next reports rebuilt the present.
        wait_for(lambda: all(client.exists(f"{prefix}:hb:{n}") for n in info["agents"]), 30)
        rebuilt.append(time.monotonic() - flushed)
    return {"rounds": rounds, "rebuilt_s": percentiles(rebuilt), "stale_epoch_refused": stale_epoch_refused(h)}


def redis_kills(h: Harness, rounds: int, rng: random.Random) -> dict[str, Any]:
    """The cluster's own Redis server killed with kill -9 mid-run; `rota up` starts it
    again (on the same socket, with at most its last snapshot). Rebuilt: every live node
    has a heartbeat newer than the kill. Skipped when the Redis is not the cluster's own
    (a URL given to `rota up`): killing a shared server would hit whoever else uses it."""
    info = h.info
    if not info.get("redis_pid"):
        return {"rounds": 0, "skipped": f"the cluster's Redis ({info['redis_url']}) is not its own process "
                "(given with --redis-url); only an embedded Redis is killed"}
    client = redis.Redis.from_url(info["redis_url"], socket_timeout=2)
    prefix = info["redis_prefix"]
    rebuilt: list[float] = []
    for _ in range(rounds):
        h.submit(2, seconds=1.0)
        time.sleep(rng.uniform(0.0, 0.6))
        pid = int(h.info["redis_pid"])
        os.kill(pid, signal.SIGKILL)
        killed, killed_wall = time.monotonic(), time.time()
        wait_for(functools.partial(_restarted, h, pid), 60)
        wait_for(functools.partial(_heartbeats_since, client, prefix, list(info["agents"]), killed_wall), 60)
        rebuilt.append(time.monotonic() - killed)
    return {"rounds": rounds, "rebuilt_s": percentiles(rebuilt), "restarts": int(h.info.get("redis_restarts", 0)),
            "stale_epoch_refused": stale_epoch_refused(h)}


def _restarted(h: Harness, old_pid: int) -> bool:
    return int(h.info.get("redis_pid") or 0) not in (0, old_pid)


def _heartbeats_since(client: redis.Redis, prefix: str, nodes: list[str], since: float) -> bool:
    """Every node's heartbeat key is there and its report was written after `since`."""
    try:
        for node in nodes:
            raw = client.get(f"{prefix}:node:{node}")
            if not client.exists(f"{prefix}:hb:{node}") or not raw or json.loads(raw)["at"] <= since:
                return False
        return True
    except redis.RedisError:  # not back yet (or this connection predates the restart)
        return False


def stale_epoch_refused(h: Harness) -> bool:
    """An agent refuses a launch older than what it already runs for the job."""
    [job_id] = h.submit(1, seconds=3.0)
    running = wait_for(lambda: (j := h.wait_running(job_id)) is not None and j, 30)
    address = h.info["agents"][running.node]["address"]
    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        job = common_pb2.Job(id=job_id, spec=common_pb2.JobSpec(command=["true"]))
        try:
            stub.Launch(agent_pb2.LaunchRequest(job=job, epoch=max(1, running.epoch - 1)), timeout=10,
                        metadata=(("authorization", f"Bearer {h.token}"),))
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.FAILED_PRECONDITION)
    return False


def agent_faults(h: Harness, rounds: int) -> dict[str, Any]:
    dead_after: list[float] = []
    for r in range(rounds):
        node = sorted(h.info["agents"])[r % len(h.info["agents"])]
        h.submit(2, seconds=2.0)
        time.sleep(0.8)
        pid, how = h.agent_pid(node), ("kill" if r % 2 == 0 else "freeze")
        os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        hit = time.monotonic()
        wait_for(health_is(h, node, "DEAD"), 60)
        dead_after.append(time.monotonic() - hit)
        if how == "kill":
            h.restart_agent(node)
        else:
            time.sleep(1.0)
            os.kill(pid, signal.SIGCONT)  # it wakes up believing in jobs it no longer holds
        wait_for(health_is(h, node, "ALIVE"), 60)
    return {"rounds": rounds, "dead_after_s": percentiles(dead_after)}


GANG_RANK_S = 20.0  # how long a gang rank runs on its own


def gang_node_kills(h: Harness, rounds: int) -> dict[str, Any]:
    """A gang on every node (one rank each) loses one node's agent to kill -9 mid-run: the
    whole gang stops (no rank of the old epoch keeps running beside the new one: the
    watch's two-copies check), the node comes back, and the gang runs again to the end.
    Timed from the kill: the control plane's decision (the job left its epoch), and, on the
    surviving nodes, until every process of the old epoch's ranks is gone (by pid, from
    /proc: the surviving agents stopped them). A rank runs 20 s; one still alive 15 s after
    the ranks were seen (before it could end on its own) is counted in `survivors_left`
    (the suite fails on any)."""
    decided: list[float] = []
    survivors_gone: list[float] = []
    killed_node_gone: list[float] = []  # the dead agent's own rank: fenced once its lease lapses
    survivors_left = 0
    nodes = sorted(h.info["agents"])
    for r in range(rounds):
        [job_id] = h.submit(1, seconds=GANG_RANK_S, gpus=0, nodes=len(nodes), gpus_per_node=1)
        first = wait_for(functools.partial(h.wait_running, job_id), 60)
        node = nodes[r % len(nodes)]
        ranks = wait_for(functools.partial(rank_pids, h.home, job_id, first.epoch, set(nodes)), 60)
        before_own_end = time.monotonic() + GANG_RANK_S - 5  # a rank gone by then was stopped
        survivors = {pid for n, pids in ranks.items() if n != node for pid in pids}
        timer, fenced = GoneTimer(survivors), GoneTimer(ranks[node])
        os.kill(h.agent_pid(node), signal.SIGKILL)
        timer.start()
        fenced.start()
        wait_for(functools.partial(_left_epoch, h, job_id, first.epoch), 60)
        decided.append(time.monotonic() - timer.started)
        gone_after = timer.result(before_own_end - timer.started)
        if gone_after is None:
            survivors_left += len(alive_pids(survivors))
        else:
            survivors_gone.append(gone_after)
        if (fenced_after := fenced.result(before_own_end - fenced.started)) is not None:
            killed_node_gone.append(fenced_after)
        wait_for(health_is(h, node, "DEAD"), 60)
        h.restart_agent(node)
        wait_for(health_is(h, node, "ALIVE"), 60)
    return {"rounds": rounds, "gang_stopped_after_s": percentiles(decided),
            "survivors_gone_after_s": percentiles(survivors_gone), "survivors_left": survivors_left,
            "killed_node_ranks_gone_after_s": percentiles(killed_node_gone)}


def rank_pids(home: Path, job_id: str, epoch: int, nodes: set[str]) -> dict[str, set[int]] | None:
    """node -> pids of the job's processes of `epoch` there (this cluster's), once every node has some."""
    found: dict[str, set[int]] = {}
    for pid, env in job_processes().items():
        if (env.get("ROTA_JOB_ID") == job_id and env.get("ROTA_EPOCH") == str(epoch)
                and env.get("ROTA_PROGRESS_FILE", "").startswith(str(home.resolve()))):
            found.setdefault(env.get("ROTA_NODE", ""), set()).add(pid)
    return found if set(found) >= nodes else None


def _left_epoch(h: Harness, job_id: str, epoch: int) -> bool:
    with h.client() as client:
        job = client.get_job(job_id)
    return job.epoch != epoch or job.state != "RUNNING"


def new_leader(h: Harness, old: int) -> Callable[[], int | None]:
    def check() -> int | None:
        pid = h.leader_pid()
        return pid if pid is not None and pid != old else None

    return check


CASES = ("allocator_kill", "redis_flush", "redis_kill", "agent_kill_and_freeze", "gang_node_kill",
         "replayed_submissions", "postgres_outage", "partition", "security")


def run_suite(h: Harness, rounds: int, seed: int = 7, only: tuple[str, ...] = CASES,
              gang_rounds: int = 0) -> dict[str, Any]:
    """The cases (every one, or `only` those) on one cluster, then the checks over every job submitted."""
    rng = random.Random(seed)
    suite: dict[str, Callable[[], dict[str, Any]]] = {
        "allocator_kill": lambda: allocator_kills(h, rounds, rng),
        "redis_flush": lambda: redis_flushes(h, max(1, rounds // 5), rng),
        "redis_kill": lambda: redis_kills(h, max(1, rounds // 5), rng),
        "agent_kill_and_freeze": lambda: agent_faults(h, max(2, rounds // 5)),
        "gang_node_kill": lambda: gang_node_kills(h, gang_rounds or max(1, rounds // 10)),
        "replayed_submissions": lambda: replays(h, rounds),
        "postgres_outage": lambda: postgres_outage(h),
        "partition": lambda: partition(h),
    }
    cases: dict[str, Any] = {}
    with Watch(h.home) as watch:
        for name, case in suite.items():
            if name not in only:
                continue
            watch.case = name  # a sighting names the case it happened in
            cases[name] = case()
        watch.case = "after the cases"
        finals = h.wait_final(list(h.submitted))
    if "security" in only:
        cases["security"] = security(h)
    launches = h.launches()
    return {
        "rounds": rounds,
        "jobs": len(finals),
        "lost_jobs": sum(1 for j in finals.values() if j.state != "SUCCEEDED"),
        "duplicated_jobs": sum(1 for j in finals.values() if launches.get(j.id, 0) > max(1, j.attempts)),
        "double_booked_gpus": len(watch.double_booked) + h.overlapping_placements(),
        "two_running_copies": len(watch.two_copies),
        "ledger_mismatches": h.ledger_mismatches(),
        "sightings": watch.sightings,
        "cases": cases,
        "not_succeeded": {j.id: f"{j.state}: {j.reason}" for j in finals.values() if j.state != "SUCCEEDED"},
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rota bench faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the allocator-kill and replay cases")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--database-url", default="", help="default: an embedded PostgreSQL")
    ap.add_argument("--redis-url", default="", help="default: an embedded Redis")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--limits", action="store_true",
                    help="every job asks for cpus 0.5 and memory 256Mi: each runs in its own cgroup")
    ap.add_argument("--cases", default=",".join(CASES), help=f"a comma list of the cases to run, of {','.join(CASES)}")
    ap.add_argument("--gang-rounds", type=int, default=0, help="rounds of the gang case (default: --rounds / 10, at least 1)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.gang_rounds < 0:
        ap.error("--rounds: must be at least 1 (--gang-rounds: not negative)")
    only = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = sorted(set(only) - set(CASES))
    if unknown or not only:
        ap.error(f"--cases: {', '.join(unknown) or 'none named'}; one or more of {', '.join(CASES)}")
    if args.limits:
        fault_harness.SPEC_DEFAULTS.update(cpus=0.5, memory="256Mi")
    home = Path(tempfile.mkdtemp(prefix="rota-faults-")) / "home"
    h = Harness(home, args.database_url, args.redis_url)
    try:
        h.start()
        report = run_suite(h, args.rounds, args.seed, only, args.gang_rounds)
    except (RotaError, TimeoutError) as exc:
        print(f"rota bench faults: {exc} (cluster logs under {home / 'logs'})", file=sys.stderr)
        return 1
    finally:
        h.stop()
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    report["command"] = " ".join(["rota bench faults", *argv])
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=2))
    bad = (report["lost_jobs"] + report["duplicated_jobs"] + report["double_booked_gpus"] + report["ledger_mismatches"]
           + report["cases"].get("gang_node_kill", {}).get("survivors_left", 0))
    return 0 if bad == 0 else 1

