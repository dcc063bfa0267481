"""docker-compose.yml, deploy/Dockerfile and deploy/k8s: every command is a real entry point.

A command is real when its first word is the `rota` console script declared in
pyproject.toml and the rest parses with the CLI's own argparse parser
(`rota.cli.main.build_parser()`), so a renamed subcommand or flag breaks this test instead of
a deployment.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rota.common.config import FORWARDED_SERVICES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
OTEL = ROOT / "deploy" / "otel-collector.yaml"

CONTROL_PLANE = ("api", "allocator", "forecaster", "ledger", "checkpoint", "detector")

COMMON_ENV = ("ROTA_DATABASE_URL", "ROTA_REDIS_URL", "ROTA_ADMIN_TOKEN", "ROTA_API_ADDR")


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def compose_services() -> dict[str, dict[str, Any]]:
    services = load_compose()["services"]
    assert isinstance(services, dict)
    return services


def rota_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the Rota image (built from deploy/Dockerfile)."""
    return {
        name: svc
        for name, svc in compose_services().items()
        if "build" in svc or str(svc.get("image", "")).startswith("rota")
    }


def k8s_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                assert isinstance(doc, dict), path
                docs.append(doc)
    return docs


def k8s_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in k8s_documents():
        if doc["kind"] in {"Deployment", "DaemonSet", "Job", "StatefulSet"}:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield f"{doc['kind']}/{doc['metadata']['name']}", container


def cli_parser() -> argparse.ArgumentParser:
    module = importlib.import_module("rota.cli.main")
    build_parser = getattr(module, "build_parser", None)
    if not callable(build_parser):
        pytest.fail("rota.cli.main.build_parser() is needed to check the deploy commands")
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def assert_rota_command(where: str, command: Any) -> None:
    assert isinstance(command, list) and command, f"{where}: command must be a non-empty list"
    assert all(isinstance(word, str) for word in command), f"{where}: every word must be a string"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert command[0] in scripts, f"{where}: {command[0]!r} is not a console script of pyproject.toml"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cli_parser().parse_args(command[1:])
    except SystemExit as exc:
        pytest.fail(
            f"{where}: `{' '.join(command)}` is rejected by the rota CLI ({exc.code}): {stderr.getvalue()}"
        )


# --- pyproject ---------------------------------------------------------------------------


def test_rota_console_script_points_at_the_cli() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["rota"] == "rota.cli.main:main"
    import rota.cli.main

    assert callable(rota.cli.main.main)


# --- docker-compose.yml ------------------------------------------------------------------


def test_compose_has_every_service() -> None:
    services = compose_services()
    expected = {"postgres", "redis", "migrate", *CONTROL_PLANE}
    assert expected <= set(services), expected - set(services)
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")
    agents = [name for name, svc in rota_services().items() if svc["command"][:2] == ["rota", "agent"]]
    assert len(agents) >= 2


@pytest.mark.parametrize("name", sorted(rota_services()))
def test_compose_command_is_a_real_entry_point(name: str) -> None:
    assert_rota_command(f"docker-compose.yml service {name}", rota_services()[name].get("command"))


def test_compose_commands_are_the_expected_ones() -> None:
    services = rota_services()
    assert services["migrate"]["command"] == ["rota", "migrate"]
    for name in CONTROL_PLANE:
        assert services[name]["command"] == ["rota", "serve", name]
    agent_names = [
        svc["command"][svc["command"].index("--name") + 1]
        for svc in services.values()
        if svc["command"][:2] == ["rota", "agent"]
    ]
    assert len(agent_names) == len(set(agent_names)), "agents need distinct node names"


def test_compose_builds_the_image_from_deploy_dockerfile() -> None:
    for name, svc in rota_services().items():
        build = svc["build"]
        assert (ROOT / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_compose_environment() -> None:
    for name, svc in rota_services().items():
        env = svc["environment"]
        assert isinstance(env, dict), f"{name}: environment must be a mapping"
        for var in COMMON_ENV:
            assert env.get(var), f"{name}: {var} is not set"
        assert env["ROTA_DATABASE_URL"] == "postgresql+psycopg://rota:rota@postgres:5432/rota"
        assert env["ROTA_REDIS_URL"] == "redis://redis:6379/0"
        assert env["ROTA_API_ADDR"] == "api:50051"
        if name != "migrate":
            host, _, port = env["ROTA_LISTEN"].rpartition(":")
            assert host == "0.0.0.0" and port.isdigit(), f"{name}: ROTA_LISTEN={env['ROTA_LISTEN']!r}"
    api_port = rota_services()["api"]["environment"]["ROTA_LISTEN"].rpartition(":")[2]
    assert api_port == "50051"
    ports = [rota_services()[n]["environment"]["ROTA_LISTEN"] for n in CONTROL_PLANE]
    assert len(set(ports)) == len(ports)


def test_compose_start_order_and_health() -> None:
    services = compose_services()
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
    migrate = services["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert str(migrate.get("restart", "no")) in {"no", "on-failure"}
    for name in CONTROL_PLANE:
        svc = services[name]
        deps = svc["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["redis"]["condition"] == "service_healthy", name
        port = svc["environment"]["ROTA_LISTEN"].rpartition(":")[2]
        test = " ".join(svc["healthcheck"]["test"])
        assert "grpc_health" in test and port in test, name
    for name, svc in rota_services().items():
        if svc["command"][:2] == ["rota", "agent"]:
            assert svc["depends_on"]["api"]["condition"] == "service_healthy", name
            assert svc["healthcheck"]["test"], name


# --- deploy/Dockerfile ---------------------------------------------------------------------


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert "download.pytorch.org/whl/cpu" in text
    assert any(line.startswith("ARG TORCH_INDEX_URL") for line in lines), "CUDA variant via build arg"
    assert any("pip install ." in line for line in lines)
    torch_at = next(i for i, line in enumerate(lines) if "TORCH_INDEX_URL}" in line and "pip install" in line)
    package_at = next(i for i, line in enumerate(lines) if "pip install ." in line)
    assert torch_at < package_at, "torch must come from the PyTorch index before `pip install .` pulls it"


# --- deploy/k8s ------------------------------------------------------------------------------


def test_compose_names_every_service_address_the_api_and_allocator_reach() -> None:
    env = rota_services()["api"]["environment"]
    for name in FORWARDED_SERVICES:
        host, _, port = env[f"ROTA_{name.upper()}_ADDR"].rpartition(":")
        assert host == name and rota_services()[name]["environment"]["ROTA_LISTEN"].endswith(f":{port}")


def test_compose_agents_and_the_checkpoint_service_share_one_chunk_store() -> None:
    store = rota_services()["checkpoint"]["environment"]["ROTA_CHUNK_STORE"]
    sharing = [n for n, svc in rota_services().items() if f"chunks:{store}" in svc.get("volumes", [])]
    agents = [n for n in rota_services() if n.startswith("agent")]
    assert agents and set(sharing) == {"checkpoint", *agents}
    assert "chunks" in load_compose()["volumes"]


def test_k8s_agents_and_the_checkpoint_service_mount_the_shared_chunk_claim() -> None:
    config = next(d for d in k8s_documents() if d["kind"] == "ConfigMap")["data"]
    for name in FORWARDED_SERVICES:
        assert config[f"ROTA_{name.upper()}_ADDR"].startswith(f"{name}.rota.svc:")
    claim = next(d for d in k8s_documents() if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    mounting = set()
    for doc in k8s_documents():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        claims = {v["name"] for v in pod.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]}
        for c in pod.get("containers", []):
            if any(m["name"] in claims and m["mountPath"] == config["ROTA_CHUNK_STORE"] for m in c.get("volumeMounts", [])):
                mounting.add(doc["kind"] + "/" + doc["metadata"]["name"])
    assert "Deployment/checkpoint" in mounting and any(m.startswith("DaemonSet/") for m in mounting)


def test_k8s_documents_are_well_formed() -> None:
    docs = k8s_documents()
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), doc


def test_k8s_has_the_expected_objects() -> None:
    by_kind: dict[str, set[str]] = {}
    for doc in k8s_documents():
        by_kind.setdefault(doc["kind"], set()).add(doc["metadata"]["name"])
    assert set(CONTROL_PLANE) <= by_kind.get("Deployment", set())
    assert set(CONTROL_PLANE) <= by_kind.get("Service", set())
    assert by_kind.get("DaemonSet")
    assert by_kind.get("Job")
    assert by_kind.get("Secret")


def test_k8s_commands_are_real_entry_points() -> None:
    seen: set[str] = set()
    for where, container in k8s_containers():
        command = container.get("command") or container.get("args") or []
        assert_rota_command(f"deploy/k8s {where}", command)
        seen.add(" ".join(command[:3]))
    assert {f"rota serve {name}" for name in CONTROL_PLANE} <= seen
    assert "rota migrate" in seen
    assert any(s.startswith("rota agent") for s in seen)


def test_k8s_secret_references_resolve() -> None:
    docs = k8s_documents()
    secrets = {
        doc["metadata"]["name"]: set(doc.get("stringData", {})) | set(doc.get("data", {}))
        for doc in docs
        if doc["kind"] == "Secret"
    }
    config_maps = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "ConfigMap"}
    for where, container in k8s_containers():
        names = {e["name"] for e in container.get("env", [])}
        for var in ("ROTA_DATABASE_URL", "ROTA_REDIS_URL", "ROTA_ADMIN_TOKEN"):
            assert var in names, f"{where}: {var} is not set"
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets.get(ref["name"], set()), f"{where}: {ref} is not in a Secret"
        for src in container.get("envFrom", []):
            if "configMapRef" in src:
                assert src["configMapRef"]["name"] in config_maps, where


# --- deploy/otel-collector.yaml --------------------------------------------------------------


def test_otel_collector_pipelines_use_defined_components() -> None:
    cfg = yaml.safe_load(OTEL.read_text(encoding="utf-8"))
    pipelines = cfg["service"]["pipelines"]
    assert "otlp" in cfg["receivers"]
    assert {"traces", "metrics"} <= set(pipelines)
    for name, pipe in pipelines.items():
        for section in ("receivers", "processors", "exporters"):
            for component in pipe.get(section, []):
                assert component in cfg[section], f"pipeline {name}: {section} {component} is not defined"
