"""A real local cluster for end-to-end tests: `rota up` as a subprocess, driven by CLI and SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from rota.client import TLS, Client, Job, UnavailableError, job_spec_from_mapping
from rota.client.home import ClusterHome, read_info

REPO = Path(__file__).resolve().parents[2]
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class RunningCluster:
    home: Path
    process: subprocess.Popen[bytes]
    database_url: str
    demo_token: str = ""  # tenant demo's, once own_cluster made it: the example files take its tenant

    @property
    def info(self) -> dict[str, Any]:
        return read_info(self.home)

    @property
    def token(self) -> str:
        return ClusterHome.read(self.home).admin_token()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
        return {**env, "ROTA_HOME": str(self.home)}

    def cli(self, *args: str, token: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "rota.cli.main", *args]
        if token is not None:
            argv += ["--token", token]
        result = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"rota {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def cli_json(self, *args: str, token: str | None = None) -> Any:
        return json.loads(self.cli(*args, "--json", token=token).stdout)

    def client(self, token: str | None = None) -> Client:
        info = self.info
        tls = TLS.from_dict(info["tls"]) if info.get("tls") else None  # `rota up --tls`
        return Client.connect(info["endpoint"], token=token or self.token, timeout=timedelta(seconds=20), tls=tls)

    def submit_job(self, name: str, command: list[str], *, tenant: str = "demo", **fields: Any) -> str:
        """A one-GPU training job (`fields` add to or override the spec) through the SDK; its id."""
        spec = job_spec_from_mapping({"name": name, "tenant": tenant, "kind": "training", "gpus": 1, "command": command,
                                  **fields}, base_dir=REPO)
        with self.client() as client:
            return client.submit(spec=spec).id

    def wait_job(self, job_id: str, states: tuple[str, ...] = FINAL, timeout_s: float = 120,
                 reason: str = "") -> Job:
        """The job once it is in one of `states` (and its reason contains `reason`, when given:
        a waiting reason is written by the allocator's next cycle, not with the state)."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while True:
                try:
                    job = client.get_job(job_id)
                except UnavailableError:  # the api is restarting; a client waits it out
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
                    continue
                if job.state in states and reason in job.reason:
                    return job
                if time.monotonic() > deadline:
                    raise AssertionError(f"{job_id} stuck in {job.state} ({job.reason}); wanted {states} {reason!r}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_cluster(
    home: Path, database_url: str, redis_url: str, *, nodes: int = 2, gpus_per_node: int = 2,
    extra_env: dict[str, str] | None = None, tls: bool = False, heartbeat_interval_s: float = 0.5,
) -> RunningCluster:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    # Heartbeats every 0.5 s (by default); a node is dead after 3 s of silence.
    env.update({"ROTA_NODE_TIMEOUT": "3", "ROTA_SCHEDULE_INTERVAL": "0.3", **(extra_env or {})})
    log = (home.parent / f"{home.name}-up.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "rota.cli.main", "up", "--home", str(home), "--nodes", str(nodes),
         "--gpus-per-node", str(gpus_per_node), "--database-url", database_url, "--redis-url", redis_url,
         "--heartbeat-interval", str(heartbeat_interval_s), *(["--tls"] if tls else [])],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    cluster = RunningCluster(home, process, database_url)
    deadline = time.monotonic() + 120
    while not (home / "cluster.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            cluster.stop()
            raise AssertionError(f"rota up failed: {(home.parent / f'{home.name}-up.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return cluster


def wait_until(condition: Any, timeout_s: float, what: str) -> Any:
    """The condition's first truthy value, polled every 0.2 s; AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def process_environments() -> dict[str, dict[str, str]]:
    """Live processes started for jobs, by pid: their whole environment."""
    found: dict[str, dict[str, str]] = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            raw = environ.read_bytes()
        except OSError:
            continue
        if b"ROTA_JOB_ID=" not in raw:
            continue
        found[environ.parent.name] = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    return found


def job_processes() -> dict[str, dict[str, str]]:
    """Live processes started for jobs, by pid: their ROTA_* environment."""
    return {pid: {k: v for k, v in env.items() if k.startswith("ROTA_")} for pid, env in process_environments().items()}


def processes_of(job_id: str) -> list[str]:
    return [pid for pid, env in job_processes().items() if env.get("ROTA_JOB_ID") == job_id]


def own_cluster(
    tmp_path_factory: Any, databases: Any, redis_url: str, name: str, **options: Any
) -> Iterator[RunningCluster]:
    """A module's own cluster on its own database, with tenant `demo` (its token kept); stopped
    and dropped after."""
    url = databases.create()
    running = start_cluster(tmp_path_factory.mktemp(name) / "home", url, redis_url, **options)
    try:
        running.demo_token = running.cli_json("tenants", "add", "demo")["token"]
        yield running
    finally:
        running.stop()
        databases.drop(url)


def reference(command: list[str], out: Path) -> list[str]:
    """The same job run straight through, outside Rota: the losses to match."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    subprocess.run([sys.executable, *command[1:], "--losses", str(out)], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=300)
    return out.read_text().splitlines()


def wait_lines(path: Path, at_least: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or len(path.read_text().splitlines()) < at_least:
        assert time.monotonic() < deadline, f"{path} has too few lines"
        time.sleep(0.1)
