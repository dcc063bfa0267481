"""docker-compose.yml (and its TLS overlay), deploy/Dockerfile and deploy/k8s (base and TLS
overlay): every command is a real entry point.

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
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rota.cli import probe
from rota.common.config import FORWARDED_SERVICES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s" / "base"
K8S_TLS = ROOT / "deploy" / "k8s" / "tls"
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
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                assert isinstance(doc, dict), path
                docs.append(doc)
    return docs


WORKLOADS = frozenset({"Deployment", "DaemonSet", "Job", "StatefulSet"})


def k8s_pods(docs: list[dict[str, Any]], kinds: frozenset[str] = WORKLOADS) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod spec, container) of every container of the given kinds of workload."""
    for doc in docs:
        if doc["kind"] in kinds:
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                yield f"{doc['kind']}/{doc['metadata']['name']}", pod, container


def k8s_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for where, _pod, container in k8s_pods(k8s_documents()):
        yield where, container


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
        assert_probes_own_port(svc, name)
    for name, svc in rota_services().items():
        if svc["command"][:2] == ["rota", "agent"]:
            assert svc["depends_on"]["api"]["condition"] == "service_healthy", name
            assert_probes_own_port(svc, name)


def assert_probes_own_port(svc: dict[str, Any], name: str) -> None:
    """The health check is rota.cli.probe (plaintext or TLS, as the service's environment
    says) on the port the service listens on, with arguments its parser accepts."""
    test = svc["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "rota.cli.probe"], name
    assert probed_address(test[4:]).rpartition(":")[2] == svc["environment"]["ROTA_LISTEN"].rpartition(":")[2], name


def probed_address(argv: list[str]) -> str:
    """The address rota.cli.probe's own parser reads from `argv` (a bad flag fails the test)."""
    parser = argparse.ArgumentParser()
    probe.add_arguments(parser)
    return str(parser.parse_args(argv).address)


def test_compose_api_serves_the_agents_on_a_node_port_the_host_does_not_see() -> None:
    api = rota_services()["api"]
    host, _, port = api["environment"]["ROTA_API_NODE_LISTEN"].rpartition(":")
    assert host == "0.0.0.0" and port.isdigit()
    assert port != api["environment"]["ROTA_LISTEN"].rpartition(":")[2]
    assert not any(str(published).split(":")[-1] == port for published in api.get("ports", []))
    agents = {n: svc for n, svc in rota_services().items() if svc["command"][:2] == ["rota", "agent"]}
    assert agents
    for name, svc in agents.items():
        assert svc["environment"]["ROTA_API_NODE_ADDR"] == f"api:{port}", name


# --- deploy/Dockerfile ---------------------------------------------------------------------


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert "download.pytorch.org/whl/cpu" in text
    assert any(line.startswith("ARG TORCH_INDEX_URL") for line in lines), "CUDA variant via build arg"
    # The services image: the package with its server extra (a bare `pip install .` is the client only).
    assert any("pip install '.[server]'" in line for line in lines)
    torch_at = next(i for i, line in enumerate(lines) if "TORCH_INDEX_URL}" in line and "pip install" in line)
    package_at = next(i for i, line in enumerate(lines) if "pip install '.[server]'" in line)
    assert torch_at < package_at, "torch must come from the PyTorch index before `pip install '.[server]'` pulls it"


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


def test_k8s_api_serves_the_agents_on_a_node_port_behind_a_service_of_its_own() -> None:
    docs = k8s_documents()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    (_, _, api), = [(w, p, c) for w, p, c in k8s_pods(docs) if w == "Deployment/api"]
    env = {e["name"]: e.get("value") for e in api["env"]}
    node_port = int(env["ROTA_API_NODE_LISTEN"].rpartition(":")[2])
    assert node_port != int(env["ROTA_LISTEN"].rpartition(":")[2])
    assert {"name": "node", "containerPort": node_port} in api["ports"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert all(p["targetPort"] != "node" for p in services["api"]["spec"]["ports"]), "the public Service: no node port"
    host, _, port = config["ROTA_API_NODE_ADDR"].rpartition(":")
    service = services[host.removesuffix(".rota.svc")]
    assert service["spec"]["selector"] == services["api"]["spec"]["selector"]
    assert {"name": "node", "port": int(port), "targetPort": "node"} in service["spec"]["ports"]


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


# --- high availability -----------------------------------------------------------------------


def test_the_allocator_runs_a_standby_replica_in_compose_and_k8s() -> None:
    assert rota_services()["allocator"]["deploy"]["replicas"] >= 2
    allocator = next(d for d in k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "allocator")
    assert allocator["spec"]["replicas"] >= 2


# --- mutual TLS: docker-compose.tls.yml ------------------------------------------------------


def compose_tls() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_TLS.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def dialled_hosts() -> set[str]:
    """Every host a Rota process dials in docker-compose.yml: service addresses and agents'."""
    hosts = set()
    for svc in rota_services().values():
        for name, value in svc["environment"].items():
            if name.startswith("ROTA_") and name.endswith("_ADDR"):
                hosts.add(value.rpartition(":")[0])
        command = svc["command"]
        if "--advertise" in command:
            hosts.add(command[command.index("--advertise") + 1].rpartition(":")[0])
    return hosts


def test_compose_tls_overlay_gives_every_service_and_agent_the_certificate_files() -> None:
    overlay = compose_tls()
    for name, svc in rota_services().items():
        if name == "migrate":  # talks to PostgreSQL only
            continue
        patch = overlay["services"][name]
        env = patch["environment"]
        assert {"ROTA_TLS_CA", "ROTA_TLS_CERT", "ROTA_TLS_KEY"} <= set(env), name
        volume, _, target = next(v for v in patch["volumes"] if v.startswith("tls:")).partition(":")
        target = target.removesuffix(":ro")
        assert all(env[k].startswith(target + "/") for k in ("ROTA_TLS_CA", "ROTA_TLS_CERT", "ROTA_TLS_KEY")), name
        assert volume in overlay["volumes"]
        assert patch["depends_on"]["certs"]["condition"] == "service_completed_successfully", name
        # The base mounts nothing at the same place, so the two files merge.
        assert all(not str(v).endswith(target) for v in svc.get("volumes", [])), name


def test_compose_tls_certs_service_names_every_host_a_process_dials() -> None:
    certs = compose_tls()["services"]["certs"]
    command = certs["command"]
    assert_rota_command("docker-compose.tls.yml service certs", command)
    args = cli_parser().parse_args(command[1:])
    assert set(args.host) >= dialled_hosts() - {"otel-collector"}
    assert any(v.startswith(f"tls:{args.directory}") for v in certs["volumes"])
    assert certs["image"] == rota_services()["api"]["image"]


def test_the_image_prepares_the_tls_folder_for_its_user() -> None:
    # A new named volume takes the ownership of the image's folder: uid 10001 must write it.
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "/var/lib/rota-tls" in text and "chown -R rota:rota" in text


# --- mutual TLS: deploy/k8s/tls ---------------------------------------------------------------

LONG_RUNNING = frozenset({"Deployment", "DaemonSet"})  # what the overlay patches (not the migration Job)


def kustomization(folder: Path) -> dict[str, Any]:
    data = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    assert data["kind"] == "Kustomization"
    return data


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]], where: str) -> None:
    """RFC 6902 `replace`, the only op the overlay uses: the path must already exist."""
    for op in ops:
        assert op["op"] == "replace", where
        *parents, last = op["path"].strip("/").split("/")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        assert (key < len(node)) if isinstance(node, list) else (key in node), f"{where}: {op['path']} is missing"
        node[key] = op["value"]


def tls_overlay_documents() -> list[dict[str, Any]]:
    """The base with the overlay's patches applied, as `kubectl apply -k deploy/k8s/tls` would."""
    docs = k8s_documents()
    for patch in kustomization(K8S_TLS)["patches"]:
        body = yaml.safe_load((K8S_TLS / patch["path"]).read_text(encoding="utf-8"))
        target = patch.get("target")
        if target is None:  # a strategic merge patch of one object: its data merges
            doc = next(d for d in docs if d["kind"] == body["kind"] and d["metadata"]["name"] == body["metadata"]["name"])
            assert doc["metadata"]["namespace"] == body["metadata"]["namespace"]
            doc["data"].update(body["data"])
            continue
        matched = [d for d in docs if d["kind"] == target["kind"]]
        assert matched, target
        for doc in matched:
            apply_json_patch(doc, body, f"{patch['path']} on {doc['metadata']['name']}")
    return docs


def test_the_k8s_base_kustomization_lists_every_manifest() -> None:
    listed = set(kustomization(K8S)["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert kustomization(K8S_TLS)["resources"] == ["../base"]


def test_the_k8s_tls_overlay_points_every_pod_at_the_mounted_secret() -> None:
    docs = tls_overlay_documents()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert config["ROTA_TLS_SERVER_NAME"]
    for where, pod, container in k8s_pods(docs, LONG_RUNNING):
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"] if m["name"] in secrets}
        for var in ("ROTA_TLS_CA", "ROTA_TLS_CERT", "ROTA_TLS_KEY"):
            folder = str(Path(config[var]).parent)
            assert folder in mounts and secrets[mounts[folder]] == "rota-tls", f"{where}: {var}"
        assert {"configMapRef": {"name": "rota"}} in container["envFrom"], where


def test_the_k8s_tls_probes_run_the_probe_on_the_containers_own_port() -> None:
    for where, _pod, container in k8s_pods(tls_overlay_documents(), LONG_RUNNING):
        listen = next(e["value"] for e in container["env"] if e["name"] == "ROTA_LISTEN")
        port = str(container["ports"][0]["containerPort"])
        for probe_name in ("readinessProbe", "livenessProbe"):
            if probe_name not in container:
                continue
            command = container[probe_name]["exec"]["command"]
            assert command[:2] == ["sh", "-c"], where
            # What the shell runs, with the container's ROTA_LISTEN.
            echoed = subprocess.run(["sh", "-c", command[2].replace("exec python", "echo python", 1)],
                                    env={"ROTA_LISTEN": listen, "PATH": "/usr/bin:/bin"},
                                    capture_output=True, text=True, check=True).stdout.split()
            assert echoed[:3] == ["python", "-m", "rota.cli.probe"], where
            assert probed_address(echoed[3:]) == f"127.0.0.1:{port}", where
