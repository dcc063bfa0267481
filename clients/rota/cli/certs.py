"""A local certificate authority for `rota up --tls`: EC keys, PEM files readable by the owner only.

Layout under HOME/tls: `ca.pem`/`ca.key` (kept across restarts, so certificates issued
earlier stay valid), `service.pem`/`service.key` (every service and agent, as server and as
client of the others; CN `service:rota`; SANs 127.0.0.1 and localhost) and
`client.pem`/`client.key` (the CLI and SDK; a CN that names no tenant, so the admin token
still decides what they may do). `issue` makes more, e.g. a tenant's (CN `tenant:NAME`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The subject names the servers read from a peer's certificate (rota.common.tls, of the server
# distribution, spells the same; tests/unit/test_tls_config.py checks that they agree).
TENANT_CN_PREFIX = "tenant:"
SERVICE_CN = "service:rota"
LOCAL_HOSTS = ("127.0.0.1", "localhost")
CLIENT_CN = "client:rota"
CA_CN = "Rota local CA"
CA_DAYS = 3650
LEAF_DAYS = 825


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True)
class LocalPKI:
    directory: Path
    ca: Issued
    service: Issued
    client: Issued


def _write_private(path: Path, data: bytes) -> None:
    """Writes a file that only its owner may read, never briefly readable by others."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rota"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(directory: Path) -> Issued:
    """The CA in `directory` (ca.pem, ca.key), made if missing."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    out = Issued(directory / "ca.pem", directory / "ca.key")
    if out.cert.exists() and out.key.exists():
        return out
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(CA_CN))
        .issuer_name(_name(CA_CN))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(out.key, _key_pem(key))
    _write_private(out.cert, cert.public_bytes(serialization.Encoding.PEM))
    return out


def issue(ca: Issued, common_name: str, cert_path: Path, key_path: Path, *, hosts: Sequence[str] = ()) -> Issued:
    """A certificate for `common_name` signed by the CA, good for TLS servers (at `hosts`) and clients."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: not an EC private key")
    key = _new_key()
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=True, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_private(key_path, _key_pem(key))
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return Issued(cert_path, key_path)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_tenant(ca: Issued, tenant: str, directory: Path) -> Issued:
    """A client certificate that authenticates as `tenant` (no token needed)."""
    if not tenant:
        raise ValueError("tenant: required")
    return issue(ca, TENANT_CN_PREFIX + tenant, directory / f"tenant-{tenant}.pem", directory / f"tenant-{tenant}.key")


def make_local_pki(directory: Path, *, hosts: Sequence[str] = LOCAL_HOSTS) -> LocalPKI:
    """The CA (kept if present) and fresh service and client certificates under `directory`."""
    ca = make_ca(directory)
    service = issue(ca, SERVICE_CN, directory / "service.pem", directory / "service.key", hosts=hosts)
    client = issue(ca, CLIENT_CN, directory / "client.pem", directory / "client.key")
    return LocalPKI(directory, ca, service, client)
