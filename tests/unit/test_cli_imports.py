"""The commands scripts run in loops import only what they use: the SDK's job API and
their own handler, never the local cluster, certificates, plots or the other services'
client modules (each of those is CPU that every `rota submit` in a loop would pay)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("rota.operator", "rota.cli.certs", "cryptography", "rota.common", "rota.cluster", "rota.client.checkpoint",
         "rota.client.detector", "rota.client.ledger", "rota.client.plan", "rota.client.forecast", "matplotlib",
         "sqlalchemy", "alembic")


def _loaded_after(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("command", ["submit", "jobs", "job", "cancel", "explain"])
def test_a_scripted_command_parses_without_the_heavy_modules(command: str) -> None:
    argv = {"submit": ["submit", "a.yaml", "b.yaml"], "jobs": ["jobs"]}.get(command, [command, "j-1"])
    loaded = _loaded_after(f"from rota.cli.main import build_parser\nbuild_parser(only={command!r}).parse_args({argv!r})")
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy
    assert "grpc" not in loaded  # parsing needs no handler: `rota submit` over HTTP none at all


def test_the_scripted_commands_handlers_bring_the_grpc_client_and_nothing_heavy() -> None:
    loaded = _loaded_after("import rota.cli.commands")
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy
    assert "rota.client.client" in loaded and "grpc" in loaded  # what the gRPC path needs


def test_submit_over_http_imports_no_grpc() -> None:
    loaded = _loaded_after("import rota.cli.http_submit, rota.cli.array_commands\n"
                           "from rota.cli.main import build_parser\nbuild_parser(only='submit').parse_args(['submit', 'a.yaml'])")
    assert "grpc" not in loaded and "rota.client.client" not in loaded
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy


def test_the_whole_cli_still_lists_every_command() -> None:
    from rota.cli.main import HANDLERS, build_parser

    parser = build_parser()
    assert {"up", "submit", "plan", "usage", "checkpoints", "health", "certs", "serve", "sim"} <= set(HANDLERS)
    args = parser.parse_args(["submit", "a.yaml", "b.yaml", "--json"])
    assert args.files == ["a.yaml", "b.yaml"] and args.json


def test_the_sdk_loads_the_other_services_results_on_first_use() -> None:
    loaded = _loaded_after("import rota.client")
    assert "rota.client.detector" not in loaded and "rota.client.checkpoint" not in loaded
    loaded = _loaded_after("import rota.client\nprint(rota.client.Verdict, rota.client.PauseResult)")
    assert {"rota.client.detector", "rota.client.checkpoint"} <= loaded
