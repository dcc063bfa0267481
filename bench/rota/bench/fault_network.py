"""The faults `rota bench faults` injects through a proxy (rota.bench.netproxy): PostgreSQL
cut off mid-run while a client keeps calling (case 3), and a partition between an agent and
the api's node port, under jitter and then cut (case 6)."""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

from rota.bench.fault_harness import Harness, health_is, job_processes, wait_for
from rota.bench.fault_requests import short_job_spec
from rota.bench.netproxy import FaultProxy
from rota.client import JobSpec, RotaError


def postgres_outage(h: Harness, outage_s: float = 10.0) -> dict[str, Any]:
    """PostgreSQL unreachable for `outage_s` mid-run while a client keeps calling."""
    assert h.pg_proxy is not None
    ids = h.submit(4, seconds=1.0)
    codes: dict[str, int] = {}
    spec = short_job_spec()
    with h.client(timeout_s=3) as client:
        h.pg_proxy.cut()
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < outage_s:
            try:
                client.get_job(ids[0])
                codes["OK"] = codes.get("OK", 0) + 1
            except RotaError as exc:
                codes[exc.code] = codes.get(exc.code, 0) + 1
            time.sleep(0.2)
        h.pg_proxy.heal()
        healed = time.monotonic()
        job = wait_for(lambda: _try_submit(client, spec), 60)
    h.submitted.append(job)
    return {"outage_s": outage_s, "status_codes_during": codes, "recovered_after_s": round(time.monotonic() - healed, 3),
            "internal_errors": codes.get("INTERNAL", 0)}


def _try_submit(client: Any, spec: JobSpec) -> str | None:
    try:
        return str(client.submit(spec=spec).id)
    except RotaError:
        return None


# The job on the node cut off runs this long; once the node is dead it must stop within
# STRANDED_WAIT_S, well before it would have ended by itself.
STRANDED_JOB_S = 15.0
STRANDED_WAIT_S = 5.0


def partition(h: Harness, jitter_s: float = 0.2, seconds: float = 8.0) -> dict[str, Any]:
    """One node reaches the api's node port (its registration and heartbeats) through a
    proxy: 200 ms of jitter must not read as death; a real cut must, within the node
    timeout; healed, the node serves again."""
    node = sorted(h.info["agents"])[-1]
    proxy = FaultProxy(h.info["node_endpoint"], delay_s=jitter_s / 2, jitter_s=jitter_s / 2).start()
    try:
        os.kill(h.agent_pid(node), signal.SIGKILL)
        wait_for(health_is(h, node, "DEAD"), 60)
        h.restart_agent(node, node_addr=proxy.address)
        wait_for(health_is(h, node, "ALIVE"), 60)
        h.submit(2, seconds=2.0)
        false_dead = 0
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            false_dead += h.node_health(node) == "DEAD"
            time.sleep(0.2)
        # A whole-node job on every node, so one runs on the node that is cut off: its agent
        # lives on (its launchers' lease stays fresh) and only the allocator can stop it.
        # The earlier cases' jobs end first, or one of them could hold that node meanwhile.
        h.wait_final(list(h.submitted))
        ids = h.submit(len(h.info["agents"]), seconds=STRANDED_JOB_S, gpus=h.gpus_per_node)
        placed = [wait_for(functools.partial(h.wait_running, job_id), 60) for job_id in ids]
        stranded = next((job.id for job in placed if job.node == node), "")
        proxy.cut()
        cut_at = time.monotonic()
        wait_for(health_is(h, node, "DEAD"), 60)
        dead_at = time.monotonic()
        stopped_after = _stopped_within(stranded, node, STRANDED_WAIT_S) if stranded else None
        proxy.heal()
        wait_for(health_is(h, node, "ALIVE"), 60)
    finally:
        proxy.delay_s = proxy.jitter_s = 0.0
    return {"jitter_ms": jitter_s * 1000, "false_dead_samples": false_dead, "cut_dead_after_s": round(dead_at - cut_at, 3),
            "stranded_job": stranded, "stranded_stopped_after_dead_s": stopped_after}


def _stopped_within(job_id: str, node: str, timeout_s: float) -> float | None:
    """Seconds until no process of the job runs on the node; None if one still runs after timeout_s."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if not any(env.get("ROTA_JOB_ID") == job_id and env.get("ROTA_NODE") == node for env in job_processes().values()):
            return round(time.monotonic() - began, 3)
        time.sleep(0.05)
    return None
