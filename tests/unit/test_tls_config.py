"""TLS settings validation, the local CA of `rota up --tls`, and certificate identities."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rota.cli.certs import CLIENT_CN, issue, issue_tenant, make_ca, make_local_pki
from rota.client import TLS
from rota.common.auth import TENANT, Identity
from rota.common.config import Settings
from rota.common.tls import (
    ON_BEHALF_OF,
    SERVICE_CN,
    TLSFiles,
    certificate_identity,
    channel_options,
    on_behalf_of,
    tls_files,
)

TLS_ENV = ("ROTA_TLS_CERT", "ROTA_TLS_KEY", "ROTA_TLS_CA")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*TLS_ENV, "ROTA_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# Settings.
def test_no_tls_variables_means_plaintext(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env()
    assert (settings.tls_cert, settings.tls_key, settings.tls_ca) == ("", "", "")
    assert tls_files(settings) is None


def test_all_three_tls_variables_are_read(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("ROTA_TLS_CERT", "/pki/service.pem")
    clean_env.setenv("ROTA_TLS_KEY", "/pki/service.key")
    clean_env.setenv("ROTA_TLS_CA", "/pki/ca.pem")
    settings = Settings.from_env()
    assert tls_files(settings) == TLSFiles(
        cert=Path("/pki/service.pem"), key=Path("/pki/service.key"), ca=Path("/pki/ca.pem")
    )


def test_the_server_name_is_read_and_checked_on_every_channel_instead_of_the_host(
    clean_env: pytest.MonkeyPatch,
) -> None:
    for name, value in zip(TLS_ENV, ("/pki/service.pem", "/pki/service.key", "/pki/ca.pem"), strict=True):
        clean_env.setenv(name, value)
    clean_env.setenv("ROTA_TLS_SERVER_NAME", " rota-services ")
    files = tls_files(Settings.from_env())
    assert files is not None and files.server_name == "rota-services"
    assert ("grpc.ssl_target_name_override", "rota-services") in channel_options(files, [("a", 1)])
    unnamed = TLSFiles(cert=files.cert, key=files.key, ca=files.ca)
    assert channel_options(unnamed, [("a", 1)]) == [("a", 1)]
    assert channel_options(None, None) == []


@pytest.mark.parametrize("missing", TLS_ENV)
def test_a_partial_tls_configuration_fails_naming_the_missing_variable(
    clean_env: pytest.MonkeyPatch, missing: str
) -> None:
    for name in TLS_ENV:
        if name != missing:
            clean_env.setenv(name, f"/pki/{name.lower()}.pem")
    with pytest.raises(ValueError, match=f"^{missing}: required"):
        Settings.from_env()


def test_a_partial_tls_settings_object_fails_naming_the_missing_variable() -> None:
    with pytest.raises(ValueError, match="^ROTA_TLS_CA: required"):
        tls_files(Settings(tls_cert="/a.pem", tls_key="/a.key"))


def test_an_unreadable_tls_file_fails_naming_its_variable(tmp_path: Path) -> None:
    files = TLSFiles(cert=tmp_path / "cert.pem", key=tmp_path / "key.pem", ca=tmp_path / "ca.pem")
    (tmp_path / "cert.pem").write_text("x")
    with pytest.raises(ValueError, match="^ROTA_TLS_KEY: cannot read"):
        files.read()


def test_sdk_tls_from_env_needs_all_three() -> None:
    assert TLS.from_env({}) is None
    assert TLS.from_env({"ROTA_TLS_CA": "c", "ROTA_TLS_CERT": "a", "ROTA_TLS_KEY": "k"}) == TLS("c", "a", "k")
    with pytest.raises(ValueError, match="^ROTA_TLS_KEY: required"):
        TLS.from_env({"ROTA_TLS_CA": "c", "ROTA_TLS_CERT": "a"})
    with pytest.raises(ValueError, match="^tls.key: required"):
        TLS.from_dict({"ca": "c", "cert": "a"})


# The local CA.
def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_local_pki_signs_service_and_client_certificates_with_ec_keys(tmp_path: Path) -> None:
    pki = make_local_pki(tmp_path / "tls")
    ca = _load(pki.ca.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for issued, cn in ((pki.service, SERVICE_CN), (pki.client, CLIENT_CN)):
        cert = _load(issued.cert)
        assert _cn(cert) == cn
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)  # raises when the signature is not the CA's
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    sans = _load(pki.service.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]


def test_every_pki_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    pki = make_local_pki(tmp_path / "tls")
    assert stat.S_IMODE(pki.directory.stat().st_mode) == 0o700
    files = [pki.ca.cert, pki.ca.key, pki.service.cert, pki.service.key, pki.client.cert, pki.client.key]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert sorted(p.name for p in pki.directory.iterdir()) == sorted(p.name for p in files)


def test_the_ca_is_kept_across_restarts_and_leaf_certificates_are_renewed(tmp_path: Path) -> None:
    first = make_local_pki(tmp_path / "tls")
    ca_pem, service_pem = first.ca.cert.read_bytes(), first.service.cert.read_bytes()
    tenant = issue_tenant(first.ca, "nlp", tmp_path)
    second = make_local_pki(tmp_path / "tls")
    assert second.ca.cert.read_bytes() == ca_pem
    assert second.service.cert.read_bytes() != service_pem
    _load(tenant.cert).verify_directly_issued_by(_load(second.ca.cert))  # still valid


def test_a_tenant_certificate_names_the_tenant(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "tls")
    tenant = issue_tenant(ca, "nlp", tmp_path)
    assert _cn(_load(tenant.cert)) == "tenant:nlp"
    with pytest.raises(ValueError, match="tenant"):
        issue_tenant(ca, "", tmp_path)


def test_the_pki_files_make_grpc_credentials(tmp_path: Path) -> None:
    from rota.common.tls import channel_credentials, server_credentials

    pki = make_local_pki(tmp_path / "tls")
    files = TLSFiles(cert=pki.service.cert, key=pki.service.key, ca=pki.ca.cert)
    assert isinstance(server_credentials(files), grpc.ServerCredentials)
    assert isinstance(channel_credentials(files), grpc.ChannelCredentials)
    other = issue(pki.ca, "x", tmp_path / "x.pem", tmp_path / "x.key", hosts=("10.0.0.1", "rota.svc"))
    names = _load(other.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["rota.svc"]


# Identity from a verified client certificate.
class FakeContext:
    def __init__(self, common_name: str | None, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._auth: dict[str, list[bytes]] = {}
        if common_name is not None:
            self._auth = {"transport_security_type": [b"ssl"], "x509_common_name": [common_name.encode()]}
        self._metadata = metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def _identity(common_name: str | None, metadata: tuple[tuple[str, str], ...] = ()) -> Identity | None:
    context: Any = FakeContext(common_name, metadata)
    return certificate_identity(context)


def test_a_tenant_common_name_is_that_tenant() -> None:
    assert _identity("tenant:nlp") == Identity(TENANT, "nlp")


@pytest.mark.parametrize("common_name", [None, "admin", "tenant:", "client:rota", SERVICE_CN, "nlp"])
def test_no_other_certificate_is_an_identity(common_name: str | None) -> None:
    assert _identity(common_name) is None


def test_only_a_service_certificate_may_act_on_behalf_of_a_tenant() -> None:
    header = on_behalf_of(Identity(TENANT, "nlp"))
    assert header == ((ON_BEHALF_OF, "tenant:nlp"),)
    assert _identity(SERVICE_CN, header) == Identity(TENANT, "nlp")
    assert _identity("client:rota", header) is None
    assert _identity(None, header) is None
    assert _identity("tenant:vision", header) == Identity(TENANT, "vision")  # its own certificate wins
    assert on_behalf_of(Identity("admin")) == ()


def test_the_certificates_rota_certs_issues_carry_the_names_the_servers_read() -> None:
    # `rota certs` is the client distribution's, rota.common.tls the server's: one spelling.
    from rota.cli import certs
    from rota.common import tls

    assert (certs.TENANT_CN_PREFIX, certs.SERVICE_CN) == (tls.TENANT_CN_PREFIX, tls.SERVICE_CN)
