"""Where a client finds its cluster: the folder `rota up --home DIR` writes, and the
variables the CLI honours. `Client.from_home` and `Client.from_env` read through here, and
so does the `rota` command.

The folder holds `cluster.json` (the api's endpoint, which `rota up` picks among free
ports, and with `--tls` the client certificate's paths) and `admin.token`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rota.client.tls import TLS

HOME_VARIABLE = "ROTA_HOME"
ENDPOINT_VARIABLE = "ROTA_ENDPOINT"
TOKEN_VARIABLE = "ROTA_TOKEN"
HTTP_ENDPOINT_VARIABLE = "ROTA_HTTP_ENDPOINT"
CLUSTER_FILE = "cluster.json"
TOKEN_FILE = "admin.token"


class NoClusterError(ValueError):
    """No cluster to talk to: no folder given and ROTA_HOME unset, a folder without a running
    cluster, or no endpoint or token from anywhere. The message says which."""


def home_path(home: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """`home` if given, else $ROTA_HOME; None when neither is set."""
    env = os.environ if environ is None else environ
    chosen = home if home is not None and str(home) else env.get(HOME_VARIABLE, "")
    return Path(chosen) if chosen else None


@dataclass(frozen=True)
class ClusterHome:
    """A running local cluster's folder: the api endpoint and, with `rota up --tls`, the
    client certificate it recorded."""

    path: Path
    endpoint: str
    tls: TLS | None
    http_endpoint: str = ""  # the api's JSON over HTTP (rota.api.http_gateway); "" when it has none

    @staticmethod
    def read(home: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> ClusterHome:
        """The folder `home` (default $ROTA_HOME); NoClusterError naming ROTA_HOME when none is
        set or the folder holds no running cluster's endpoint."""
        path = home_path(home, environ)
        if path is None:
            raise NoClusterError(f"no cluster folder: pass home= or set {HOME_VARIABLE} "
                                 "(the folder `rota up --home DIR` writes)")
        info = read_info(path)
        endpoint = info.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            raise NoClusterError(f"{HOME_VARIABLE}={path}: {CLUSTER_FILE} holds no endpoint")
        recorded = info.get("tls")
        http = info.get("http_endpoint")
        return ClusterHome(path=path, endpoint=endpoint, tls=TLS.from_dict(recorded) if recorded else None,
                           http_endpoint=http if isinstance(http, str) else "")

    def admin_token(self) -> str:
        """The cluster's admin token (`rota up` writes it once, readable by its owner only)."""
        file = self.path / TOKEN_FILE
        try:
            token = file.read_text().strip()
        except OSError as exc:
            raise NoClusterError(f"{HOME_VARIABLE}={self.path}: cannot read {TOKEN_FILE}: {exc.strerror or exc}") from exc
        if not token:
            raise NoClusterError(f"{HOME_VARIABLE}={self.path}: {TOKEN_FILE} is empty")
        return token


def read_info(home: Path) -> dict[str, Any]:
    """Everything `cluster.json` holds (endpoint, services, agents, pids, ...)."""
    path = home / CLUSTER_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NoClusterError(f"{HOME_VARIABLE}={home}: no running cluster there (no {CLUSTER_FILE}); "
                             f"start one with `rota up --home {home}`") from None
    except OSError as exc:
        raise NoClusterError(f"{HOME_VARIABLE}={home}: cannot read {CLUSTER_FILE}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise NoClusterError(f"{HOME_VARIABLE}={home}: {CLUSTER_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise NoClusterError(f"{HOME_VARIABLE}={home}: {CLUSTER_FILE} must hold a mapping")
    return data


@dataclass(frozen=True)
class Connection:
    endpoint: str
    token: str  # "" only with TLS: a tenant's client certificate stands in for a token
    tls: TLS | None
    # The same api's JSON over HTTP: ROTA_HTTP_ENDPOINT, else the cluster folder's when the
    # gRPC endpoint is the folder's too; "" when none is known or ROTA_HTTP_ENDPOINT=none
    # (then gRPC only).
    http_endpoint: str = ""


def resolve_connection(
    *, endpoint: str | None = None, token: str | None = None, home: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Connection:
    """What to dial, with what: each of endpoint and token is the argument, else ROTA_ENDPOINT /
    ROTA_TOKEN, else the cluster folder (`home`, else ROTA_HOME: its endpoint and admin token).
    TLS: ROTA_TLS_CA/CERT/KEY, else the client certificate `rota up --tls` recorded."""
    env = os.environ if environ is None else environ
    path = home_path(home, env)
    endpoint = endpoint or env.get(ENDPOINT_VARIABLE) or None
    token = token or env.get(TOKEN_VARIABLE) or None
    tls = TLS.from_env(env)
    # The folder is read once, and only when it is needed: for what the arguments and the
    # variables leave out, or for the certificate `rota up --tls` recorded.
    need_folder = not endpoint or not token
    http_endpoint = env.get(HTTP_ENDPOINT_VARIABLE, "")
    http_off = http_endpoint == "none"  # ROTA_HTTP_ENDPOINT=none: gRPC only
    if path is not None and (need_folder or (tls is None and (path / CLUSTER_FILE).exists())):
        found = ClusterHome.read(path)
        tls = tls or found.tls
        if need_folder:
            endpoint = endpoint or found.endpoint
            token = token or found.admin_token()
        if not http_endpoint and endpoint == found.endpoint:
            http_endpoint = found.http_endpoint
    if http_off:
        http_endpoint = ""
    if not endpoint:
        raise NoClusterError(f"no cluster: set {HOME_VARIABLE} (the folder `rota up --home DIR` writes), "
                             f"or {ENDPOINT_VARIABLE} and {TOKEN_VARIABLE}")
    if not token and tls is None:  # with TLS a tenant's client certificate may stand in for a token
        raise NoClusterError(f"no token: set {TOKEN_VARIABLE} (or {HOME_VARIABLE} for the admin token)")
    return Connection(endpoint=endpoint, token=token or "", tls=tls, http_endpoint=http_endpoint)


__all__ = ["ClusterHome", "Connection", "NoClusterError", "home_path", "read_info", "resolve_connection",
           "CLUSTER_FILE", "TOKEN_FILE"]
