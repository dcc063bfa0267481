"""`rota certs` and the health probe deployments run (`python -m rota.cli.probe`), against
real gRPC servers started the way every service starts (`start_server`, through
`health_only_server`), plaintext and mutual TLS; the probe runs as a real process with the environment a container gives it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2

from rota.bench.tls_probe import health_only_server
from rota.cli.certs import issue, make_ca
from rota.cli.main import HANDLERS, build_parser
from rota.common.tls import TLSFiles

PROBE_TIMEOUT_S = 30


def probe(address: str, **tls_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env.update(tls_env)
    return subprocess.run([sys.executable, "-m", "rota.cli.probe", address, "--timeout", "5"], env=env,
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)


def sans(cert: Path) -> list[str]:
    ext = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    return [str(name.value) for name in ext]


@pytest.fixture(scope="module")
def named_only(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A service certificate naming only `rota-services` (not the address dialled)."""
    root = tmp_path_factory.mktemp("named")
    ca = make_ca(root)
    cert = issue(ca, "service:rota", root / "svc.pem", root / "svc.key", hosts=("rota-services",))
    return TLSFiles(cert=cert.cert, key=cert.key, ca=ca.cert)


def tls_env(files: TLSFiles, server_name: str = "") -> dict[str, str]:
    env = {"ROTA_TLS_CERT": str(files.cert), "ROTA_TLS_KEY": str(files.key), "ROTA_TLS_CA": str(files.ca)}
    if server_name:
        env["ROTA_TLS_SERVER_NAME"] = server_name
    return env


def test_the_probe_passes_a_serving_plaintext_server_and_fails_one_not_health_only_server() -> None:
    with health_only_server(None) as (address, started, loop):
        ok = probe(address)
        assert ok.returncode == 0, ok.stderr
        assert "SERVING" in ok.stdout
        asyncio.run_coroutine_threadsafe(
            started.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING), loop).result(10)
        down = probe(address)
    assert down.returncode == 1
    assert "NOT_SERVING" in down.stderr


def test_the_probe_fails_where_nothing_listens(tmp_path: Path) -> None:
    with health_only_server(None) as (address, _, _):
        pass  # stopped: the port is free again
    done = probe(address)
    assert done.returncode == 1
    assert "UNAVAILABLE" in done.stderr


def test_certs_make_a_service_certificate_the_probe_verifies_over_mutual_tls(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    args = build_parser().parse_args(["certs", str(out), "--host", "api", "--host", "rota-services",
                                      "--tenant", "alpha"])
    assert HANDLERS["certs"](args) == 0
    assert {"127.0.0.1", "localhost", "api", "rota-services"} <= set(sans(out / "service.pem"))
    for key in ("ca.key", "service.key", "client.key", "tenant-alpha.key"):
        assert (out / key).stat().st_mode & 0o077 == 0, key
    service = TLSFiles(cert=out / "service.pem", key=out / "service.key", ca=out / "ca.pem")
    with health_only_server(service) as (address, _, _):
        ok = probe(address, **tls_env(service))
        plain = probe(address)
    assert ok.returncode == 0, ok.stderr
    assert plain.returncode == 1  # a TLS port refuses the plaintext probe


def test_certs_keep_the_ca_so_certificates_issued_earlier_stay_valid(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    for _ in range(2):
        args = build_parser().parse_args(["certs", str(out)])
        ca_before = (out / "ca.pem").read_bytes() if (out / "ca.pem").exists() else None
        assert HANDLERS["certs"](args) == 0
    assert ca_before == (out / "ca.pem").read_bytes()


def test_the_server_name_setting_verifies_a_certificate_that_does_not_name_the_address(named_only: TLSFiles) -> None:
    with health_only_server(named_only) as (address, _, _):
        by_address = probe(address, **tls_env(named_only))
        by_name = probe(address, **tls_env(named_only, server_name="rota-services"))
        wrong_name = probe(address, **tls_env(named_only, server_name="elsewhere"))
    assert by_address.returncode == 1  # 127.0.0.1 is not in the certificate
    assert by_name.returncode == 0, by_name.stderr
    assert wrong_name.returncode == 1


def test_certs_refuse_an_empty_host_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rota.cli.running import run

    args = build_parser().parse_args(["certs", str(tmp_path / "tls"), "--host", " "])
    assert run(HANDLERS["certs"], args) != 0
    assert "--host" in capsys.readouterr().err
    assert not (tmp_path / "tls" / "ca.pem").exists()


def test_certs_json_names_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["certs", str(tmp_path / "tls"), "--tenant", "beta", "--json"])
    assert HANDLERS["certs"](args) == 0
    files = json.loads(capsys.readouterr().out)
    paths = [files["ca"], *files["service"].values(), *files["client"].values(), *files["tenants"]["beta"].values()]
    assert all(Path(p).is_file() for p in paths)
