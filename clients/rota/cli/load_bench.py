"""`rota bench load [--seconds S] [--threads T] [--rate R] [--json]`: submissions under load.

On a real local cluster with the live loop running, through the api with durable commits:
1. sustained: T closed-loop client threads submit as fast as the api answers for S
   seconds; submissions per second and latency percentiles;
2. paced: submissions at a fixed rate R (open loop, default 200/s); latency percentiles
   (a call that falls behind the pace still counts from its scheduled time);
3. idle: one job at a time on an idle cluster, from submit to RUNNING.
Every job is a short sleep; what is still queued at the end is cancelled.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rota.cli.faults import TENANT, Harness, percentiles, sleep_spec
from rota.client import Client
from rota.v1 import common_pb2


def _spec(priority: int = 1) -> common_pb2.JobSpec:
    return sleep_spec(0.2, interval=0.1, priority=priority, restart="never")


def sustained(h: Harness, seconds: float, threads: int) -> dict[str, Any]:
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop_at = time.monotonic() + seconds

    def worker(k: int) -> None:
        spec = _spec()
        with h.client() as client:
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                client.submit(spec=spec, request_id=str(uuid.uuid4()))
                latencies[k].append(time.perf_counter() - t0)

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    done = [x for per in latencies for x in per]
    return {"threads": threads, "submissions": len(done), "per_second": round(len(done) / (time.monotonic() - started), 1),
            "latency_ms": {k: v * 1000 if k != "n" else v for k, v in percentiles(done).items()}}


def paced(h: Harness, seconds: float, rate: float, threads: int) -> dict[str, Any]:
    """Open loop: submission i is due at start + i / rate, whichever thread takes it."""
    total = int(seconds * rate)
    next_index = [0]
    lock = threading.Lock()
    latencies: list[float] = []
    start = time.perf_counter() + 0.2

    def worker() -> None:
        spec = _spec()
        with h.client() as client:
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= total:
                    return
                due = start + i / rate
                time.sleep(max(0.0, due - time.perf_counter()))
                client.submit(spec=spec, request_id=str(uuid.uuid4()))
                with lock:
                    latencies.append(time.perf_counter() - due)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    achieved = len(latencies) / (time.perf_counter() - start)
    return {"rate": rate, "achieved_per_second": round(achieved, 1), "submissions": len(latencies),
            "latency_ms": {k: v * 1000 if k != "n" else v for k, v in percentiles(latencies).items()}}


def idle_to_running(h: Harness, samples: int) -> dict[str, Any]:
    times: list[float] = []
    with h.client() as client:
        for _ in range(samples):
            t0 = time.perf_counter()
            job = client.submit(spec=_spec(priority=10))
            while client.get_job(job.id).state not in ("RUNNING", "SUCCEEDED", "FAILED"):
                time.sleep(0.01)
            times.append(time.perf_counter() - t0)
            client.wait(job.id)
    return {"samples": samples, "seconds": percentiles(times)}


def cancel_queued(client: Client) -> int:
    queued = client.list_jobs(tenant=TENANT, states=["PENDING"])
    for job in queued:
        client.cancel(job.id, reason="load benchmark over")
    return len(queued)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rota bench load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the sustained and paced phases")
    ap.add_argument("--threads", type=int, default=8, help="client threads")
    ap.add_argument("--rate", type=float, default=200.0, help="paced phase: submissions per second")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--database-url", default="", help="default: an embedded PostgreSQL")
    ap.add_argument("--redis-url", default="", help="default: an embedded Redis")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.threads < 1 or args.rate <= 0:
        ap.error("--seconds, --threads and --rate must be positive")
    home = Path(tempfile.mkdtemp(prefix="rota-load-")) / "home"
    h = Harness(home, args.database_url, args.redis_url, allocators=1)
    try:
        h.start()
        report: dict[str, Any] = {"idle_submit_to_running": idle_to_running(h, 5)}
        report["sustained"] = sustained(h, args.seconds, args.threads)
        with h.client() as client:
            cancel_queued(client)
        report["paced"] = paced(h, args.seconds, args.rate, args.threads)
        with h.client() as client:
            report["cancelled_after"] = cancel_queued(client)
    finally:
        h.stop()
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
