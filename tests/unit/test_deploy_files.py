"""docker-compose.yml (and its TLS overlay), deploy/Dockerfile and deploy/k8s (base and TLS
overlay): every command is a real entry point.

A command is real when its first word is the `rota` console script declared in
pyproject.toml and the rest parses with the CLI's own argparse parser
(`rota.cli.main.build_parser()`), so a renamed subcommand or flag breaks this test instead of
a deployment.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import json
import re
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
# The web console: HTML over HTTP, a client of the api acting with its users' tokens, so it
# gets no store URL and no admin token (and serves neither gRPC nor /metrics).
CONSOLE = "console"
SECRETS = ("ROTA_DATABASE_URL", "ROTA_REDIS_URL", "ROTA_ADMIN_TOKEN")

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
    scripts = tomllib.loads((ROOT / "clients" / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
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
    # The client distribution carries the command (clients/pyproject.toml); the server one depends on it.
    scripts = tomllib.loads((ROOT / "clients" / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
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
    assert services["migrate"]["command"] == ["rota", "db", "migrate"]
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
        if name == CONSOLE:
            assert env["ROTA_API_ADDR"] == "api:50051" and not set(SECRETS) & set(env), name
            assert env["ROTA_LISTEN"].startswith("0.0.0.0:"), name
            continue
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
    # The services image: the server distribution with the client one (`./clients` alone is the client only).
    assert any("pip install ./clients ." in line for line in lines)
    torch_at = next(i for i, line in enumerate(lines) if "TORCH_INDEX_URL}" in line and "pip install" in line)
    package_at = next(i for i, line in enumerate(lines) if "pip install ./clients ." in line)
    assert torch_at < package_at, "torch must come from the PyTorch index before `pip install ./clients .` pulls it"


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
    assert "rota db migrate" in seen
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
        for var in SECRETS:
            assert (var not in names) if where == f"Deployment/{CONSOLE}" else (var in names), f"{where}: {var}"
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


def selected(doc: dict[str, Any], selector: str) -> bool:
    """Whether a label selector of `key=value` and `key!=value` terms (kustomize's) picks `doc`."""
    labels = doc["metadata"].get("labels", {})
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negated = "!=" in term
        key, _, value = term.partition("!=" if negated else "=")
        if (labels.get(key.strip()) == value.strip()) == negated:
            return False
    return True


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
        matched = [d for d in docs if d["kind"] == target["kind"] and selected(d, target.get("labelSelector", ""))]
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
            if "httpGet" in container[probe_name]:  # the console's: HTTP on its own port, as in the base
                assert container[probe_name]["httpGet"]["port"] in (container["ports"][0]["name"], int(port)), where
                continue
            command = container[probe_name]["exec"]["command"]
            assert command[:2] == ["sh", "-c"], where
            # What the shell runs, with the container's ROTA_LISTEN.
            echoed = subprocess.run(["sh", "-c", command[2].replace("exec python", "echo python", 1)],
                                    env={"ROTA_LISTEN": listen, "PATH": "/usr/bin:/bin"},
                                    capture_output=True, text=True, check=True).stdout.split()
            assert echoed[:3] == ["python", "-m", "rota.cli.probe"], where
            assert probed_address(echoed[3:]) == f"127.0.0.1:{port}", where


# --- metrics: deploy/grafana, deploy/prometheus.yml, scraping --------------------------------

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
K8S_MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
METRIC_SOURCES = ROOT / "services" / "rota"
EXPECTED_DASHBOARDS = ("rota-cluster-overview", "rota-tenants-fairness", "rota-scheduler", "rota-node-health")
# Labels Prometheus itself puts on every scraped series (and our relabelling adds).
TARGET_LABELS = frozenset({"instance", "job", "service"})

PROMQL_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                             "unless", "offset", "inf", "nan", "atan2"})
PROMQL_FUNCTIONS = frozenset({
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile", "stddev", "stdvar", "count_values", "group",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "label_replace", "label_join",
    "clamp", "clamp_min", "clamp_max", "abs", "ceil", "floor", "round", "vector", "scalar", "time", "timestamp",
    "absent", "absent_over_time", "changes", "resets", "sort", "sort_desc", "sgn", "exp", "ln", "log2", "log10",
    "sqrt", "predict_linear", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time",
    "count_over_time", "last_over_time", "quantile_over_time",
})


def rota_metrics() -> dict[str, frozenset[str]]:
    """Every series name Rota exposes -> its labels, read from the sources that define them:
    prometheus_client's Counter (exposed as NAME_total), Histogram (NAME_bucket with `le`,
    NAME_sum, NAME_count) and Gauge in rota.common.metrics, and the families that the
    scrape-time collectors build with rota.common.metrics.gauge(NAME, HELP, LABELS, ROWS)."""
    out: dict[str, frozenset[str]] = {}
    for path in sorted(METRIC_SOURCES.glob("**/metrics.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        kinds = _metric_makers(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kinds):
                continue
            kind, first = kinds[node.func.id], node.args[0]
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), f"{path}: {ast.dump(node)}"
            name = first.value
            keywords = {k.arg: k.value for k in node.keywords}
            labels = _strings(node.args[2] if len(node.args) > 2 else keywords.get("labels" if kind == "gauge" else "labelnames"))
            if kind == "Counter":
                out[name.removesuffix("_total") + "_total"] = labels
            elif kind == "Histogram":
                out[name + "_bucket"] = labels | {"le"}
                out[name + "_sum"] = out[name + "_count"] = labels
            else:
                out[name] = labels
    return out


def _metric_makers(tree: ast.Module) -> dict[str, str]:
    """The module's local names for what makes a metric -> what it makes."""
    kinds: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in {"prometheus_client", "rota.common.metrics"}:
            for alias in node.names:
                if alias.name in {"Counter", "Gauge", "Histogram", "gauge"}:
                    kinds[alias.asname or alias.name] = alias.name
    return kinds


def _strings(node: ast.expr | None) -> frozenset[str]:
    if node is None:
        return frozenset()
    assert isinstance(node, ast.List | ast.Tuple), ast.dump(node)
    values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    assert len(values) == len(node.elts), ast.dump(node)
    return frozenset(values)


def metric_families() -> set[str]:
    """The metric names without their series suffixes (what docs/operators.md lists)."""
    families = set()
    for name in rota_metrics():
        for suffix in ("_total", "_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name.startswith("rota_"):
                name = name.removesuffix(suffix)
                break
        families.add(name)
    return families


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable of every dashboard."""
    for name, board in dashboards().items():
        for panel in all_panels(board):
            for target in panel.get("targets", []):
                yield f"{name}: panel {panel['title']!r} {target['refId']}", target["expr"]
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                yield f"{name}: variable {var['name']}", query


def promql_names(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The series names an expression selects (each with the label names its matchers use)
    and the label names of its by/without/on/ignoring/group_* clauses. Grafana's variables
    and string literals are blanked first; a function or keyword is no series name."""
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "1m", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'", '""', text)
    grouping: set[str] = set()
    for clause in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", text):
        grouping |= {label.strip() for label in clause.group(1).split(",") if label.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    selected: dict[str, set[str]] = {}
    for selector in re.finditer(r"([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}", text):
        matchers = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", selector.group(2)))
        selected.setdefault(selector.group(1), set()).update(matchers)
    assert not re.search(r"(?:^|[^\w:])\{", text), f"a selector without a metric name: {expr}"
    text = re.sub(r"\{[^{}]*\}|\[[^\[\]]*\]", " ", text)
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if word in PROMQL_KEYWORDS:
            continue
        if call:
            assert word in PROMQL_FUNCTIONS, f"{word}() is no PromQL function this test knows: {expr}"
        else:
            selected.setdefault(word, set())
    return selected, grouping


def test_promql_names_reads_selectors_and_grouping_labels() -> None:
    selected, grouping = promql_names(
        'histogram_quantile(0.95, sum by (le, kind) (rate(a_bucket{x=~"$v", y!="z"}[$__rate_interval]))) '
        "/ on (instance) group_left () (b == 1) and max(c) without (q)"
    )
    assert selected == {"a_bucket": {"x", "y"}, "b": set(), "c": set()}
    assert grouping == {"le", "kind", "instance", "q"}


def test_the_metric_names_parsed_from_the_sources_are_the_registry_s() -> None:
    from rota.common.metrics import REGISTRY

    registered = {family.name for family in REGISTRY.collect() if not family.name.startswith("process_")}
    assert registered and registered <= metric_families()
    # The scrape-time collectors' families, which no registry knows before a scrape.
    assert {"rota_jobs", "rota_node_gpus", "rota_tenant_fairness_ratio", "rota_gpu_utilization_ratio"} <= metric_families()
    assert rota_metrics()["rota_node_gpus"] == {"node", "state"}
    assert rota_metrics()["rota_rpc_server_handled_total"] == {"grpc_service", "grpc_method", "grpc_code"}


def test_the_four_dashboards_exist_parse_and_are_tidy() -> None:
    boards = dashboards()
    assert set(EXPECTED_DASHBOARDS) <= set(boards), set(EXPECTED_DASHBOARDS) - set(boards)
    uids = [b["uid"] for b in boards.values()]
    titles = [b["title"] for b in boards.values()]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)
    for name, board in boards.items():
        assert board["uid"] == name, f"{name}.json: uid {board['uid']!r} should be the file's name"
        assert board.get("id") is None, f"{name}: a provisioned dashboard has no id"
        assert isinstance(board["schemaVersion"], int) and "rota" in board["tags"]
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in all_panels(board)]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        taken: dict[tuple[int, int], str] = {}
        for panel in all_panels(board):
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, f"{name}: {panel['title']}"
            for cell in ((x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])):
                assert cell not in taken, f"{name}: {panel['title']!r} overlaps {taken[cell]!r}"
                taken[cell] = panel["title"]
            if panel["type"] == "row":
                continue
            assert panel.get("title") and panel.get("description"), f"{name}: a panel needs a title and description"
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, f"{name}: {panel['title']}"
            assert panel.get("targets"), f"{name}: panel {panel['title']!r} has no target"
            for target in panel["targets"]:
                assert target.get("expr", "").strip(), f"{name}: panel {panel['title']!r} has an empty query"
                assert target["datasource"] == panel["datasource"]
            used = set()
            for target in panel["targets"]:
                used |= set(re.findall(r"\$(\w+)", target["expr"]))
            assert used - {"__rate_interval", "__interval", "__range"} <= set(variables), f"{name}: {panel['title']}"


def test_every_metric_a_dashboard_queries_is_one_rota_defines() -> None:
    defined = rota_metrics()
    used: set[str] = set()
    for where, expr in dashboard_queries():
        label_values = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", expr)
        if label_values:
            expr = label_values.group(1)
        selected, grouping = promql_names(expr)
        assert selected, f"{where}: no metric in {expr!r}"
        for name, matchers in selected.items():
            assert name in defined, f"{where}: {name} is no metric Rota defines ({expr})"
            unknown = matchers - defined[name] - TARGET_LABELS
            assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"
        labels = set().union(*(defined[n] for n in selected)) | TARGET_LABELS
        if label_values:
            grouping.add(label_values.group(2))
        assert grouping <= labels, f"{where}: no metric of {expr!r} has the labels {sorted(grouping - labels)}"
        used |= set(selected)
    families = {n.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
                for n in used}
    # Each dashboard's subject is on some dashboard: every Rota metric is shown somewhere.
    assert metric_families() - families == set(), metric_families() - families


def test_grafana_provisioning_points_at_the_dashboards_compose_mounts() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text(encoding="utf-8"))
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "rota-prometheus"
    host, _, port = source["url"].removeprefix("http://").partition(":")
    services = compose_services()
    assert host in services and services[host]["image"].startswith("prom/prometheus")
    assert f"{port}:{port}" in services[host]["ports"]
    for board in dashboards().values():
        default = next(v for v in board["templating"]["list"] if v["name"] == "datasource")
        assert default["current"]["value"] == source["uid"]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rota.yaml").read_text(encoding="utf-8"))
    (provider,) = providers["providers"]
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    mounts = {target.removesuffix(":ro"): source for source, _, target in (v.partition(":") for v in grafana["volumes"])}
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == (GRAFANA / "provisioning").resolve()
    assert (ROOT / mounts[provider["options"]["path"]]).resolve() == DASHBOARDS.resolve()
    assert "3000:3000" in grafana["ports"]
    home = grafana["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home.startswith(provider["options"]["path"] + "/")
        assert (DASHBOARDS / home.rpartition("/")[2]).exists()


def serving_compose_services() -> dict[str, dict[str, Any]]:
    """The compose services whose process serves /metrics: the control plane's services and
    the agents (not the one-shot migration, nor the web console, which is an api client)."""
    return {
        n: s for n, s in rota_services().items()
        if s["command"][:2] == ["rota", "agent"] or s["command"][:3] in [["rota", "serve", c] for c in CONTROL_PLANE]
    }


def test_prometheus_scrapes_every_compose_service_that_serves_metrics() -> None:
    serving = serving_compose_services()
    assert set(CONTROL_PLANE) <= set(serving)
    assert sum(svc["command"][:2] == ["rota", "agent"] for svc in serving.values()) >= 2
    for name, svc in serving.items():
        host, _, port = svc["environment"].get("ROTA_METRICS_LISTEN", "").rpartition(":")
        assert host == "0.0.0.0" and port.isdigit(), f"{name}: ROTA_METRICS_LISTEN must be 0.0.0.0:PORT"
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    assert config["global"]["scrape_interval"]
    scraped: set[tuple[str, str]] = set()
    for job in config["scrape_configs"]:
        assert job["job_name"] and job.get("metrics_path", "/metrics") == "/metrics"
        for dns in job.get("dns_sd_configs", []):
            assert dns.get("type", "SRV") == "A"
            scraped |= {(n, str(dns["port"])) for n in dns["names"]}
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                scraped.add((host, port))
    for name, svc in rota_services().items():
        if "ROTA_METRICS_LISTEN" in svc["environment"]:
            port = svc["environment"]["ROTA_METRICS_LISTEN"].rpartition(":")[2]
            assert (name, port) in scraped, f"deploy/prometheus.yml does not scrape {name}:{port}"
    prometheus = compose_services()["prometheus"]
    mounted = {target.removesuffix(":ro"): source for source, _, target in (v.partition(":") for v in prometheus["volumes"])}
    config_file = next(a.partition("=")[2] for a in prometheus["command"] if a.startswith("--config.file="))
    assert (ROOT / mounted[config_file]).resolve() == PROMETHEUS.resolve()


def test_k8s_pods_that_serve_metrics_carry_the_scrape_annotations() -> None:
    docs = k8s_documents()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    host, _, port = config["ROTA_METRICS_LISTEN"].rpartition(":")
    assert host == "0.0.0.0" and port.isdigit()
    seen = set()
    for doc in docs:
        if doc["kind"] not in LONG_RUNNING or doc["metadata"]["name"] == CONSOLE:
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        template = doc["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", where
        assert annotations.get("prometheus.io/port") == port, where
        assert annotations.get("prometheus.io/path") == "/metrics", where
        (container,) = template["spec"]["containers"]
        assert {"name": "metrics", "containerPort": int(port)} in container["ports"], where
        assert {"configMapRef": {"name": "rota"}} in container["envFrom"], where
        assert "ROTA_METRICS_LISTEN" not in {e["name"] for e in container.get("env", [])}, where
        seen.add(where)
    assert {f"Deployment/{n}" for n in CONTROL_PLANE} | {"DaemonSet/agent"} <= seen


def test_k8s_podmonitor_scrapes_the_metrics_port_of_the_rota_pods() -> None:
    assert kustomization(K8S_MONITORING)["resources"] == ["podmonitor.yaml"]
    (monitor,) = yaml.safe_load_all((K8S_MONITORING / "podmonitor.yaml").read_text(encoding="utf-8"))
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["namespace"] == "rota"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "rota"}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert "../monitoring" not in kustomization(K8S)["resources"], "the base must apply without the operator's CRDs"


def test_the_operators_guide_lists_every_metric() -> None:
    """The table of docs/operators.md names each metric as a user queries it: a counter
    with `_total`, a histogram by its name (its series add `_bucket`, `_sum`, `_count`)."""
    text = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    exposed = rota_metrics()
    histograms = {n.removesuffix("_bucket") for n in exposed if n.endswith("_bucket")}
    names = histograms | {n for n in exposed if n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
                          not in histograms}
    missing = {name for name in names if f"| `{name}` |" not in text}
    assert not missing, f"docs/operators.md (Metrics and dashboards) does not list {sorted(missing)}"
    listed = set(re.findall(r"^\| `(rota_\w+)` \|", text, flags=re.M))
    assert listed - names == set(), f"docs/operators.md lists metrics that no code defines: {sorted(listed - names)}"


# --- the web console ----------------------------------------------------------------------------


def test_the_console_runs_in_compose_and_k8s_beside_the_api_with_no_store_or_admin_token() -> None:
    console = rota_services()[CONSOLE]
    assert console["command"] == ["rota", "serve", CONSOLE]
    assert console["depends_on"]["api"]["condition"] == "service_healthy"
    port = console["environment"]["ROTA_LISTEN"].rpartition(":")[2]
    assert f"{port}:{port}" in console["ports"] and f"{port}/healthz" in " ".join(console["healthcheck"]["test"])
    docs = k8s_documents()
    (_, _, container), = [(w, p, c) for w, p, c in k8s_pods(docs) if w == f"Deployment/{CONSOLE}"]
    assert {"configMapRef": {"name": "rota"}} in container["envFrom"]
    assert not set(SECRETS) & {e["name"] for e in container["env"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == CONSOLE)
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    # The TLS overlay gives the console the certificate but keeps its HTTP probes.
    overlaid = list(k8s_pods(tls_overlay_documents(), LONG_RUNNING))
    (tls,) = [c for w, _p, c in overlaid if w == f"Deployment/{CONSOLE}"]
    assert "httpGet" in tls["readinessProbe"]
    assert all("exec" in c["readinessProbe"] for w, _p, c in overlaid
               if w.startswith("Deployment/") and w != f"Deployment/{CONSOLE}")
