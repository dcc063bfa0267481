"""`rota bench load [--seconds S] [--processes P] [--threads T] [--rate R] [--api-workers W] [--cli] [--array N] [--json]`: submissions under load.

On a real local cluster with the live loop running, through the api with durable commits:
1. sustained: T closed-loop client threads, spread over P client processes, submit as
   fast as the api answers for S seconds; submissions per second and latency percentiles;
2. paced: submissions at a fixed rate R (open loop, default 200/s); latency percentiles
   (a call that falls behind the pace still counts from its scheduled time);
3. idle: one job at a time on an idle cluster (IDLE_SETTLE_S after the previous one
   finished), from submit to RUNNING;
4. with `--cli`: the same T loops over P processes, each running `rota submit FILE --json`
   as a new process (the Slurm user's `sbatch` loop): rate, latency and CPU per call;
5. with `--array N`: one array of N jobs, one call (rota.bench.load_cli);
6. with `--breakdown`: one call at a time, the RPC alone, a read, a submit and the stores
   alone (rota.bench.load_breakdown).
Every job is a short sleep (coreutils `sleep 1`: see JOB_COMMAND); what is still queued
at the end is cancelled. The clients
are separate processes because one Python process's threads share one interpreter lock:
on a small machine a threaded client measures itself as much as the api.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc

from rota.bench import load_breakdown, load_cli
from rota.bench.fault_harness import TENANT, Harness, percentiles, sleep_spec
from rota.client import Client, JobSpec
from rota.client.client import _RETRY_CONFIG

START_DELAY_S = 0.5  # every client process is up and connected before the clock starts
# Between idle samples: the previous job's completion is planned for (and the allocator's
# short rest after that plan is over) before the next submission, so each sample starts
# on an idle cluster rather than mid-cycle.
IDLE_SETTLE_S = 1.0
CONNECT_TIMEOUT_S = 10.0


# Real processes, started by the agents, but the cheapest there are, a second long: on this
# one machine the jobs (and their launchers) share the control plane's two cores, which a
# real cluster's GPU nodes would not; a Python job's start-up (about 0.15 s of CPU), a few
# times a second, would be measured instead of the api.
JOB_COMMAND = ("sleep", "1")


def _spec(priority: int = 1) -> JobSpec:
    return dataclasses.replace(sleep_spec(0.2, interval=0.1, priority=priority, restart="never"), command=JOB_COMMAND)


def _connect(endpoint: str, token: str) -> Client:
    """An SDK client (its retry policy included) on a TCP connection of its own: gRPC would
    otherwise share one connection among a process's channels, and the kernel spreads
    connections, not calls, over the api processes sharing the port."""
    options = [("grpc.service_config", _RETRY_CONFIG), ("grpc.enable_retries", 1), ("grpc.use_local_subchannel_pool", 1)]
    channel = grpc.insecure_channel(endpoint, options=options)
    # Connected before the clock starts: a phase measures submissions, not TCP and HTTP/2
    # set-up (16 connections opening at once took the first 0.7 s of a paced phase).
    grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    return Client(channel, token=token, timeout=timedelta(seconds=20))


def _ready(_k: int) -> bool:
    """Runs once in each client process before a phase: imports done, pool warm."""
    time.sleep(0.2)  # long enough that every process of the pool takes one
    return True


def _sustained_client(endpoint: str, token: str, threads: int, start_at: float, stop_at: float) -> list[float]:
    """One client process: `threads` closed loops between start_at and stop_at (wall clock)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    clients = [_connect(endpoint, token) for _ in range(threads)]

    def loop(k: int) -> None:
        spec, client = _spec(), clients[k]
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < stop_at:
            t0 = time.perf_counter()
            client.submit(spec=spec, request_id=str(uuid.uuid4()))
            latencies[k].append(time.perf_counter() - t0)

    _run_threads(loop, threads)
    for client in clients:
        client.close()
    return [x for per in latencies for x in per]


def _paced_client(endpoint: str, token: str, threads: int, start_at: float, rate: float,
                  indices: range) -> list[float]:
    """One client process: submission i (of `indices`) is due at start_at + i / rate,
    whichever of its threads takes it; latency counts from the due time."""
    pending = iter(indices)
    lock = threading.Lock()
    latencies: list[float] = []
    clients = [_connect(endpoint, token) for _ in range(threads)]

    def loop(k: int) -> None:
        spec, client = _spec(), clients[k]
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            due = start_at + i / rate
            time.sleep(max(0.0, due - time.time()))
            client.submit(spec=spec, request_id=str(uuid.uuid4()))
            done = time.time()
            with lock:
                latencies.append(done - due)

    _run_threads(loop, threads)
    for client in clients:
        client.close()
    return latencies


def _run_threads(target: Any, count: int) -> None:
    pool = [threading.Thread(target=target, args=(k,)) for k in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _split(total: int, parts: int) -> list[int]:
    """`total` threads over `parts` processes, as evenly as they go (none empty)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _ms(values: list[float]) -> dict[str, float]:
    return {k: round(v * 1000, 1) if k != "n" else v for k, v in percentiles(values).items()}


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each of the cluster's processes has used, by its name
    with the worker number dropped (api-2 counts as api)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        group = "api" if name.startswith("api") else "agents" if name.startswith("node-") else name.split("-")[0]
        used[group] = used.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def sustained(h: Harness, seconds: float, threads: int, processes: int = 1) -> dict[str, Any]:
    shares = _split(threads, processes)
    endpoint, token = h.info["endpoint"], h.token
    pids = {str(k): int(v) for k, v in h.info.get("pids", {}).items()}
    with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_ready, range(len(shares))))
        start_at = time.time() + START_DELAY_S
        stop_at = start_at + seconds
        futures = [pool.submit(_sustained_client, endpoint, token, n, start_at, stop_at) for n in shares]
        before = _cpu_seconds(pids)
        done = [x for f in futures for x in f.result()]
        after = _cpu_seconds(pids)
        elapsed = time.time() - start_at
    # Where the machine's CPU went per durable submission, by the cluster's processes (the
    # clients, PostgreSQL and Redis are not among them): a figure the other load on the
    # machine does not move much, unlike the rate.
    cpu = {name: round((after[name] - before.get(name, 0.0)) / max(1, len(done)) * 1000, 3) for name in after}
    return {"threads": threads, "processes": len(shares), "submissions": len(done),
            "per_second": round(len(done) / elapsed, 1), "latency_ms": _ms(done), "cpu_ms_per_submission": cpu}


def paced(h: Harness, seconds: float, rate: float, threads: int, processes: int = 1) -> dict[str, Any]:
    """Open loop: submission i is due at start + i / rate; process k takes every P-th one."""
    total = int(seconds * rate)
    shares = _split(threads, processes)
    endpoint, token = h.info["endpoint"], h.token
    with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_ready, range(len(shares))))
        start_at = time.time() + START_DELAY_S
        futures = [pool.submit(_paced_client, endpoint, token, n, start_at, rate, range(k, total, len(shares)))
                   for k, n in enumerate(shares)]
        latencies = [x for f in futures for x in f.result()]
        elapsed = time.time() - start_at
    return {"rate": rate, "achieved_per_second": round(len(latencies) / elapsed, 1), "submissions": len(latencies),
            "threads": threads, "processes": len(shares), "latency_ms": _ms(latencies)}


def idle_to_running(h: Harness, samples: int) -> dict[str, Any]:
    times: list[float] = []
    with h.client() as client:
        for _ in range(samples):
            time.sleep(IDLE_SETTLE_S)
            t0 = time.perf_counter()
            job = client.submit(spec=_spec(priority=10))
            while client.get_job(job.id).state not in ("RUNNING", "SUCCEEDED", "FAILED"):
                time.sleep(0.01)
            times.append(time.perf_counter() - t0)
            client.wait(job.id)
    return {"samples": samples, "seconds": percentiles(times)}


def cancel_queued(client: Client) -> int:
    """Cancels every PENDING job of the benchmark's tenant (listing returns 500 at a time)."""
    cancelled = 0
    with ThreadPoolExecutor(8) as pool:  # thousands of them after a sustained phase
        while queued := client.list_jobs(tenant=TENANT, states=["PENDING"]):
            list(pool.map(lambda job: client.cancel(job.id, reason="load benchmark over"), queued))
            cancelled += len(queued)
    return cancelled


def durability(h: Harness) -> dict[str, str]:
    """The server settings that say what an acknowledged commit survives."""
    rows = h.sql("SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method')")
    return {str(name): str(setting) for name, setting in rows}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rota bench load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the sustained and paced phases")
    ap.add_argument("--threads", type=int, default=16, help="client threads, over all client processes")
    ap.add_argument("--processes", type=int, default=2, help="client processes")
    ap.add_argument("--rate", type=float, default=200.0, help="paced phase: submissions per second")
    ap.add_argument("--api-workers", type=int, default=2, help="api processes sharing the api port")
    ap.add_argument("--cli", action="store_true", help="also T loops of `rota submit FILE --json` processes")
    ap.add_argument("--array", type=int, default=0, metavar="N", help="also one array of N jobs (one call)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also where one submission's time goes: the RPC alone, a read, a submit, the stores alone")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--database-url", default="", help="default: an embedded PostgreSQL")
    ap.add_argument("--redis-url", default="", help="default: an embedded Redis")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.threads < 1 or args.rate <= 0 or args.processes < 1 or args.api_workers < 1:
        ap.error("--seconds, --threads, --processes, --api-workers and --rate must be positive")
    if args.array < 0:
        ap.error("--array: a number of jobs, at least 1 (0: no array phase)")
    home = Path(tempfile.mkdtemp(prefix="rota-load-")) / "home"
    # No PostgreSQL proxy: nothing is cut off here, and a proxy would add a hop per query.
    h = Harness(home, args.database_url, args.redis_url, allocators=1, api_workers=args.api_workers,
                proxy_postgres=False, fast_timers=False)
    def drain() -> int:
        """Cancels what the previous phase left queued, so the next starts on an empty queue."""
        with h.client() as client:
            return cancel_queued(client)

    try:
        h.start()
        report: dict[str, Any] = {"idle_submit_to_running": idle_to_running(h, 5)}
        report["sustained"] = sustained(h, args.seconds, args.threads, args.processes)
        drain()
        report["paced"] = paced(h, args.seconds, args.rate, args.threads, args.processes)
        report["cancelled_after"] = drain()
        if args.cli:
            report["cli"] = load_cli.cli(h, args.seconds, args.threads, args.processes, home.parent)
            drain()
            # The same loops through the gRPC client: what the HTTP gateway saves a script.
            report["cli_grpc"] = load_cli.cli(h, args.seconds, args.threads, args.processes, home.parent, grpc_only=True)
            report["cli"]["vs_grpc"] = round(report["cli"]["per_second"] / max(0.1, report["cli_grpc"]["per_second"]), 2)
            report["cancelled_after"] += drain()
        if args.array:
            report["array"] = load_cli.array(h, args.array)
        if args.breakdown:
            report["breakdown"] = load_breakdown.breakdown(h, _spec())
            report["cancelled_after"] += drain()
        report["api_workers"] = args.api_workers
        report["job_command"] = list(JOB_COMMAND)
        report["timers"] = "defaults"  # heartbeats, scheduling cycle, ledger period: as `rota up` sets them
        report["postgres"] = durability(h)
    finally:
        h.stop()
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
