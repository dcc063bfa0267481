"""`rota bench load --breakdown`: where one durable submission's time goes, one call at a time.

On the same running cluster, each measured SAMPLES times in a row (p50 and p99, ms):
1. `WhoAmI` through the SDK: a gRPC round trip to the api with its interceptor (token
   check from the cache, deadline, span) and no store: the RPC's own cost;
2. `GetJob`: the same plus one Postgres read;
3. `SubmitJob`: the RPC, validation, the insert, the fsync'd commit (shared with any
   concurrent submission) and the job's event on Redis;
4. the stores alone, from this process: an `INSERT` + `COMMIT` on the cluster's Postgres
   (a throwaway table, so the same fsync a submission waits for) and a Redis `XADD`.
Submit minus WhoAmI is the api's work past the RPC; the store rows say how much of that
is the commit and the event, and what is left is Python in the api (ORM, validation).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from rota.bench.fault_harness import Harness, percentiles
from rota.client import JobSpec

SAMPLES = 300


def _timed(call: Callable[[], Any], samples: int) -> dict[str, float]:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {k: round(v * 1000, 2) for k, v in percentiles(times).items() if k != "n"}


def breakdown(h: Harness, spec: JobSpec, samples: int = SAMPLES) -> dict[str, Any]:
    import redis
    from sqlalchemy import create_engine, text

    from rota.common.db import normalize_url

    out: dict[str, Any] = {"samples": samples}
    with h.client() as client:
        job = client.submit(spec=spec)
        client.whoami()  # the token is in the api's cache from here on
        out["whoami_rpc_ms"] = _timed(client.whoami, samples)
        out["get_job_ms"] = _timed(lambda: client.get_job(job.id), samples)
        out["submit_ms"] = _timed(lambda: client.submit(spec=spec, request_id=str(uuid.uuid4())), samples)
    engine = create_engine(normalize_url(h.direct_url), pool_size=1)
    with engine.connect() as conn:
        table = "bench_commit_durable"  # not TEMP: a temporary table's commit skips the WAL's fsync
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {table} (id text)"))
        conn.commit()

        def commit() -> None:
            conn.execute(text(f"INSERT INTO {table} VALUES (:id)"), {"id": uuid.uuid4().hex})
            conn.commit()

        out["postgres_insert_commit_ms"] = _timed(commit, samples)
        conn.execute(text(f"DROP TABLE {table}"))
        conn.commit()
    engine.dispose()
    r = redis.Redis.from_url(h.info["redis_url"])
    key = f"bench:breakdown:{uuid.uuid4().hex}"
    out["redis_xadd_ms"] = _timed(lambda: r.xadd(key, {"event": "state"}, maxlen=100), samples)
    r.delete(key)
    r.close()
    return out
