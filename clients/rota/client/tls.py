"""Mutual TLS for the SDK: which PEM files a client presents and trusts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

ENV_VARIABLES = ("ROTA_TLS_CA", "ROTA_TLS_CERT", "ROTA_TLS_KEY")


@dataclass(frozen=True)
class TLS:
    """`ca` verifies the server; `cert` and `key` are this client's certificate and key.

    A certificate whose subject CN is `tenant:NAME` authenticates as that tenant when no
    token is given; the admin role always needs the admin token."""

    ca: Path | str
    cert: Path | str
    key: Path | str

    def credentials(self) -> grpc.ChannelCredentials:
        data = []
        for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            try:
                data.append(Path(path).read_bytes())
            except OSError as exc:
                raise ValueError(f"tls.{name}: cannot read {path}: {exc.strerror or exc}") from exc
        ca, cert, key = data
        import grpc  # here: reading job files and the cluster folder needs no gRPC

        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def as_dict(self) -> dict[str, str]:
        return {"ca": str(self.ca), "cert": str(self.cert), "key": str(self.key)}

    @staticmethod
    def from_dict(data: Mapping[str, str]) -> TLS:
        missing = [k for k in ("ca", "cert", "key") if not data.get(k)]
        if missing:
            raise ValueError(f"tls.{missing[0]}: required")
        return TLS(ca=data["ca"], cert=data["cert"], key=data["key"])

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> TLS | None:
        """From ROTA_TLS_CA, ROTA_TLS_CERT and ROTA_TLS_KEY: all three, or None when none is set."""
        env = os.environ if environ is None else environ
        values = {name: env.get(name, "") for name in ENV_VARIABLES}
        if not any(values.values()):
            return None
        missing = [name for name, value in values.items() if not value]
        if missing:
            raise ValueError(f"{missing[0]}: required with the other ROTA_TLS_* variables")
        return TLS(ca=values["ROTA_TLS_CA"], cert=values["ROTA_TLS_CERT"], key=values["ROTA_TLS_KEY"])
