"""TLS and mutual TLS for every service, agent and internal client, from `Settings`.

When ROTA_TLS_CERT, ROTA_TLS_KEY and ROTA_TLS_CA are set, a server listens on a TLS port
only (a plaintext client fails its handshake: UNAVAILABLE) and requires a client
certificate signed by the CA; every channel a service opens presents this process's
certificate and trusts only that CA. Unset, everything is plaintext as before.

Identity from a certificate (`certificate_identity`): a verified client certificate whose
subject CN is `tenant:NAME` acts as tenant NAME when the call carries no bearer token. No
certificate grants the admin role: that needs the admin token. A service certificate (CN
`service:rota`, what `rota up --tls` gives the services) may forward a tenant identity it
authenticated from a certificate in the `rota-on-behalf-of` header (the api's forwarder
does, so a certificate-only tenant reaches the forwarded services too); from any other
peer that header is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rota.common.auth import TENANT, Identity
from rota.common.config import Settings

TENANT_CN_PREFIX = "tenant:"
SERVICE_CN = "service:rota"
ON_BEHALF_OF = "rota-on-behalf-of"

ChannelOptions = Sequence[tuple[str, Any]]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: this process's certificate chain and key, and the CA that signs its peers;
    `server_name`, when set, is the name a server's certificate must carry (instead of the
    host of the address dialled)."""

    cert: Path
    key: Path
    ca: Path
    server_name: str = ""

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(cert, key, ca) bytes; a missing file fails naming its variable."""
        out = []
        for variable, path in (("ROTA_TLS_CERT", self.cert), ("ROTA_TLS_KEY", self.key), ("ROTA_TLS_CA", self.ca)):
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise ValueError(f"{variable}: cannot read {path}: {exc.strerror or exc}") from exc
        return out[0], out[1], out[2]


def tls_files(settings: Settings) -> TLSFiles | None:
    """The TLS files the settings name, or None for plaintext."""
    if not (settings.tls_cert or settings.tls_key or settings.tls_ca):
        return None
    for variable, value in (("ROTA_TLS_CERT", settings.tls_cert), ("ROTA_TLS_KEY", settings.tls_key),
                            ("ROTA_TLS_CA", settings.tls_ca)):
        if not value:
            raise ValueError(f"{variable}: required with the other ROTA_TLS_* settings")
    return TLSFiles(cert=Path(settings.tls_cert), key=Path(settings.tls_key), ca=Path(settings.tls_ca),
                    server_name=settings.tls_server_name)


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """Mutual TLS: the server presents its certificate and requires one signed by the CA."""
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(tls: TLSFiles) -> grpc.ChannelCredentials:
    """Trusts only the CA; presents this process's certificate as the client certificate."""
    cert, key, ca = tls.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def channel_options(tls: TLSFiles | None, options: ChannelOptions | None) -> list[tuple[str, Any]]:
    """`options`, with the server-name override when the TLS files name one."""
    opts = list(options or ())
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


def open_channel(address: str, tls: TLSFiles | None, options: ChannelOptions | None = None) -> grpc.Channel:
    """A synchronous channel to `address`: mutual TLS when `tls` is given, else plaintext."""
    opts = channel_options(tls, options)
    if tls is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, channel_credentials(tls), options=opts)


def open_aio_channel(address: str, tls: TLSFiles | None, options: ChannelOptions | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `address`: mutual TLS when `tls` is given, else plaintext."""
    opts = channel_options(tls, options)
    if tls is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(address, channel_credentials(tls), options=opts)


def bind(server: grpc.aio.Server, listen: str, tls: TLSFiles | None) -> int:
    """Adds the listening port (TLS only when configured); returns the bound port."""
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, server_credentials(tls))
    if port == 0:
        raise RuntimeError(f"ROTA_LISTEN: cannot bind {listen}")
    return int(port)


def peer_common_name(context: grpc.aio.ServicerContext) -> str:
    """Subject CN of the peer's verified client certificate; '' on plaintext or without one."""
    auth: Any = context.auth_context() or {}
    values = auth.get("x509_common_name") or ()
    for value in values:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return ""


def _tenant_of(text: str) -> str:
    if text.startswith(TENANT_CN_PREFIX):
        return text[len(TENANT_CN_PREFIX):].strip()
    return ""


def certificate_identity(context: grpc.aio.ServicerContext) -> Identity | None:
    """The tenant a verified client certificate names (see the module doc), or None."""
    common_name = peer_common_name(context)
    tenant = _tenant_of(common_name)
    if tenant:
        return Identity(TENANT, tenant)
    if common_name == SERVICE_CN:
        for key, value in context.invocation_metadata() or ():
            if key == ON_BEHALF_OF:
                delegated = _tenant_of(value.decode() if isinstance(value, bytes) else value)
                if delegated:
                    return Identity(TENANT, delegated)
    return None


def on_behalf_of(identity: Identity) -> tuple[tuple[str, str], ...]:
    """Metadata a service adds when it forwards a certificate-authenticated tenant's call."""
    if identity.is_admin or not identity.tenant:
        return ()
    return ((ON_BEHALF_OF, TENANT_CN_PREFIX + identity.tenant),)
