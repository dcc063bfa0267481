"""Commands a deployment runs beside the services: `rota certs` and `rota probe`.

`rota certs DIR [--host NAME ...] [--tenant NAME ...]` makes the mutual-TLS files a
deployment mounts: the CA (kept when DIR already has one, so earlier certificates stay
valid), the services' certificate (SANs 127.0.0.1, localhost and every --host), the CLI's
certificate, and one client certificate per --tenant (CN `tenant:NAME`).

`rota probe ADDRESS`: see rota.cli.probe.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rota.client.errors import InvalidArgumentError

Handler = Callable[[argparse.Namespace], int]


def certs_arguments(certs_p: argparse.ArgumentParser) -> None:
    certs_p.add_argument("directory", help="where the PEM files go (the CA in it is kept if present)")
    certs_p.add_argument("--host", action="append", default=[], metavar="NAME",
                         help="a DNS name or IP the services' certificate carries besides 127.0.0.1 and "
                              "localhost (e.g. each compose service name, or ROTA_TLS_SERVER_NAME); repeatable")
    certs_p.add_argument("--tenant", action="append", default=[], metavar="NAME",
                         help="also a client certificate that authenticates as this tenant; repeatable")
    certs_p.add_argument("--json", action="store_true", help="print the file paths as JSON")


def certs(args: argparse.Namespace) -> int:
    from rota.cli.certs import LOCAL_HOSTS, issue_tenant, make_local_pki  # cryptography: only here

    hosts = [h.strip() for h in args.host]
    if any(not h or "," in h or " " in h for h in hosts):
        raise InvalidArgumentError("--host: one DNS name or IP address per flag, not empty", field="host")
    tenants = [t.strip() for t in args.tenant]
    if any(not t for t in tenants):
        raise InvalidArgumentError("--tenant: must not be empty", field="tenant")
    directory = Path(args.directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    pki = make_local_pki(directory, hosts=tuple(dict.fromkeys([*LOCAL_HOSTS, *hosts])))
    files: dict[str, Any] = {
        "ca": str(pki.ca.cert),
        "service": {"cert": str(pki.service.cert), "key": str(pki.service.key)},
        "client": {"cert": str(pki.client.cert), "key": str(pki.client.key)},
        "tenants": {},
    }
    for tenant in tenants:
        issued = issue_tenant(pki.ca, tenant, directory)
        files["tenants"][tenant] = {"cert": str(issued.cert), "key": str(issued.key)}
    if args.json:
        print(json.dumps(files))
        return 0
    print(f"CA and certificates in {directory} (keys readable by their owner only)")
    print("every service and agent:")
    print(f"  ROTA_TLS_CA={files['ca']} ROTA_TLS_CERT={files['service']['cert']} ROTA_TLS_KEY={files['service']['key']}")
    print("the CLI and SDK:")
    print(f"  ROTA_TLS_CA={files['ca']} ROTA_TLS_CERT={files['client']['cert']} ROTA_TLS_KEY={files['client']['key']}")
    for tenant, pair in files["tenants"].items():
        print(f"tenant {tenant}: {pair['cert']} {pair['key']}")
    return 0
