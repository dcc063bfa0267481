"""The SDK as a user meets it, without a cluster: log lines from chunks cut anywhere, finding
the cluster (`Client.from_home`, `Client.from_env`) and its errors, and `JobSpec`."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rota.client import (
    Client,
    Dependency,
    InvalidArgumentError,
    JobSpec,
    NoClusterError,
    job_spec_from_mapping,
    load_job_spec,
)
from rota.client._wire import spec_from_proto, spec_to_proto
from rota.client.client import log_lines
from rota.client.home import ClusterHome, resolve_connection
from rota.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]


# Log lines.
@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([], []),
        ([b""], []),
        ([b"one\ntwo\n"], ["one", "two"]),
        ([b"one\ntw", b"o\nthree\n"], ["one", "two", "three"]),  # a line split across two chunks
        ([b"a", b"b", b"c\n"], ["abc"]),
        ([b"one\n", b"last"], ["one", "last"]),  # a final line without a newline
        ([b"one\n", b"la", b"st"], ["one", "last"]),
        ([b"\n\n"], ["", ""]),  # empty lines stay, one per newline
        ([b"one", b"\n", b"\n", b"two"], ["one", "", "two"]),
        ([b"crlf\r\n", b"next\r", b"\n"], ["crlf", "next"]),  # a "\r\n" split across chunks too
        ([b"progress\r50%\n"], ["progress\r50%"]),  # a bare "\r" is the line's own
        (["é\n".encode()[:1], "é\n".encode()[1:]], ["é"]),  # a UTF-8 character split across chunks
        ([b"bad \xff byte\n"], ["bad \ufffd byte"]),
        ([b"cut \xc3"], ["cut \ufffd"]),  # a character the stream ends inside
    ],
    ids=repr,
)
def test_log_lines(chunks: list[bytes], lines: list[str]) -> None:
    assert list(log_lines(chunks)) == lines


def test_log_lines_come_as_soon_as_their_newline_does() -> None:
    seen: list[str] = []

    def chunks() -> Any:
        yield b"first\nsec"
        assert seen == ["first"]  # the complete line was handed out before the next chunk was read
        yield b"ond\n"

    for line in log_lines(chunks()):
        seen.append(line)
    assert seen == ["first", "second"]


# Finding the cluster.
def _home(tmp_path: Path, info: Any = None, token: str | None = "ra-admin") -> Path:
    home = tmp_path / "home"
    home.mkdir()
    if info is not None:
        (home / "cluster.json").write_text(info if isinstance(info, str) else json.dumps(info))
    if token is not None:
        (home / "admin.token").write_text(token + "\n")
    return home


def test_from_home_without_a_home_or_rota_home_names_rota_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTA_HOME", raising=False)
    with pytest.raises(NoClusterError, match="ROTA_HOME"):
        Client.from_home()


def test_from_home_with_an_empty_rota_home_names_rota_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROTA_HOME", "")
    with pytest.raises(NoClusterError, match="ROTA_HOME"):
        Client.from_home()


def test_from_home_of_a_folder_without_a_cluster_names_rota_home_and_the_folder(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with pytest.raises(NoClusterError, match="ROTA_HOME") as info:
        Client.from_home(home)
    assert str(home) in str(info.value) and "rota up" in str(info.value)


def test_from_home_reads_rota_home_when_not_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path)
    monkeypatch.setenv("ROTA_HOME", str(home))
    with pytest.raises(NoClusterError) as info:
        Client.from_home()
    assert f"ROTA_HOME={home}" in str(info.value)


@pytest.mark.parametrize(
    ("info", "says"),
    [({"services": {}}, "no endpoint"), ({"endpoint": ""}, "no endpoint"), ({"endpoint": 5}, "no endpoint"),
     ("{not json", "not valid JSON"), ("[1]", "mapping")],
    ids=["missing", "empty", "not a string", "bad JSON", "a list"],
)
def test_from_home_of_a_cluster_file_without_an_endpoint(tmp_path: Path, info: Any, says: str) -> None:
    with pytest.raises(NoClusterError, match="ROTA_HOME") as raised:
        Client.from_home(_home(tmp_path, info))
    assert says in str(raised.value)


def test_from_home_without_the_admin_token_says_so_unless_a_token_is_given(tmp_path: Path) -> None:
    home = _home(tmp_path, {"endpoint": "127.0.0.1:1"}, token=None)
    with pytest.raises(NoClusterError, match="admin.token"):
        Client.from_home(home)
    Client.from_home(home, token="rt-tenant", timeout=timedelta(seconds=1)).close()  # no token file needed


def test_no_cluster_is_a_value_error_as_the_cli_reports_it() -> None:
    assert issubclass(NoClusterError, ValueError)


def test_the_home_gives_endpoint_token_and_recorded_tls(tmp_path: Path) -> None:
    tls = {"ca": "/x/ca.pem", "cert": "/x/cli.pem", "key": "/x/cli.key"}
    home = _home(tmp_path, {"endpoint": "127.0.0.1:4321", "tls": tls})
    found = ClusterHome.read(home)
    assert (found.endpoint, found.admin_token()) == ("127.0.0.1:4321", "ra-admin")
    assert found.tls is not None and found.tls.as_dict() == tls
    assert ClusterHome.read(environ={"ROTA_HOME": str(home)}) == found


def test_from_home_dials_lazily(tmp_path: Path) -> None:
    with Client.from_home(_home(tmp_path, {"endpoint": "127.0.0.1:1"}), timeout=timedelta(seconds=1)) as client:
        assert client._metadata == (("authorization", "Bearer ra-admin"),)


def test_from_env_prefers_variables_then_the_home(tmp_path: Path) -> None:
    home = _home(tmp_path, {"endpoint": "127.0.0.1:4321"})
    only_home = resolve_connection(environ={"ROTA_HOME": str(home)})
    assert (only_home.endpoint, only_home.token, only_home.tls) == ("127.0.0.1:4321", "ra-admin", None)
    both = resolve_connection(environ={"ROTA_HOME": str(home), "ROTA_ENDPOINT": "h:1", "ROTA_TOKEN": "rt-x"})
    assert (both.endpoint, both.token) == ("h:1", "rt-x")
    given = resolve_connection(endpoint="h:2", token="rt-y", environ={"ROTA_ENDPOINT": "h:1", "ROTA_TOKEN": "rt-x"})
    assert (given.endpoint, given.token) == ("h:2", "rt-y")
    # No ROTA_HOME needed when both are set; a missing one is filled from the home.
    assert resolve_connection(environ={"ROTA_ENDPOINT": "h:1", "ROTA_TOKEN": "t"}).endpoint == "h:1"
    assert resolve_connection(environ={"ROTA_HOME": str(home), "ROTA_TOKEN": "t"}).endpoint == "127.0.0.1:4321"


def test_from_env_takes_the_tls_variables_before_the_recorded_certificate(tmp_path: Path) -> None:
    recorded = {"ca": "/r/ca.pem", "cert": "/r/cli.pem", "key": "/r/cli.key"}
    home = _home(tmp_path, {"endpoint": "127.0.0.1:4321", "tls": recorded})
    assert resolve_connection(environ={"ROTA_HOME": str(home)}).tls.as_dict() == recorded  # type: ignore[union-attr]
    tls_env = {"ROTA_TLS_CA": "/e/ca.pem", "ROTA_TLS_CERT": "/e/t.pem", "ROTA_TLS_KEY": "/e/t.key"}
    # A tenant's certificate alone, no token: the certificate is the identity.
    found = resolve_connection(environ={"ROTA_ENDPOINT": "h:1", **tls_env})
    assert found.token == "" and found.tls is not None and found.tls.cert == "/e/t.pem"
    with pytest.raises(ValueError, match="ROTA_TLS_KEY"):
        resolve_connection(environ={"ROTA_ENDPOINT": "h:1", "ROTA_TOKEN": "t", "ROTA_TLS_CA": "/e/ca.pem",
                                    "ROTA_TLS_CERT": "/e/t.pem"})


@pytest.mark.parametrize(
    ("environ", "says"),
    [({}, "ROTA_HOME"), ({"ROTA_TOKEN": "t"}, "ROTA_ENDPOINT"), ({"ROTA_ENDPOINT": "h:1"}, "ROTA_TOKEN")],
    ids=["nothing", "a token only", "an endpoint only"],
)
def test_from_env_without_enough_says_what_to_set(environ: dict[str, str], says: str) -> None:
    with pytest.raises(NoClusterError, match=says):
        Client.from_env(environ=environ)


def test_from_env_with_a_rota_home_that_holds_no_cluster(tmp_path: Path) -> None:
    with pytest.raises(NoClusterError, match="ROTA_HOME"):
        Client.from_env(environ={"ROTA_HOME": str(_home(tmp_path))})


# JobSpec.
def test_a_job_spec_is_frozen_and_keyword_only() -> None:
    spec = JobSpec(command=["true"])
    with pytest.raises(AttributeError):
        spec.gpus = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        JobSpec(["true"])  # type: ignore[misc]


def test_a_job_spec_becomes_the_wire_message(tmp_path: Path) -> None:
    proto = spec_to_proto(JobSpec(
        name="ft", tenant="nlp", kind="batch_inference", priority=7, gpus=4, command=["python", "x.py", 3],  # type: ignore[list-item]
        workdir="sub", env={"A": "1"}, duration=timedelta(minutes=90), preemptible=True, restart="on-failure",
        max_retries=2, features={"params": 1.3e9, "variant": "lora"}, max_swap=1, accepts_layout_changes=True,
    ), base_dir=tmp_path)
    assert (proto.name, proto.tenant, proto.priority, proto.gpus, proto.max_retries) == ("ft", "nlp", 7, 4, 2)
    assert proto.kind == common_pb2.JOB_KIND_BATCH_INFERENCE and proto.restart == common_pb2.RESTART_POLICY_ON_FAILURE
    assert list(proto.command) == ["python", "x.py", "3"] and dict(proto.env) == {"A": "1"}
    assert proto.workdir == str((tmp_path / "sub").resolve())
    assert proto.duration_seconds == 5400.0 and proto.preemptible and proto.accepts_layout_changes
    assert proto.features["variant"] == "lora" and proto.max_swap == 1


def test_a_job_spec_defaults_as_a_job_file_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    proto = spec_to_proto(JobSpec(command=["true"]))
    assert proto.kind == common_pb2.JOB_KIND_TRAINING and (proto.priority, proto.gpus) == (5, 1)
    assert proto.workdir == str(tmp_path.resolve()) and not proto.HasField("duration_seconds")
    assert not proto.HasField("features")


@pytest.mark.parametrize(
    ("spec", "field"),
    [(JobSpec(command=["true"], kind="gaming"), "kind"), (JobSpec(command=["true"], restart="always"), "restart"),
     (JobSpec(command="python run.py"), "command"), (JobSpec(command=["true"], features={"f": object()}), "features")],
    ids=["kind", "restart", "command string", "features"],
)
def test_what_cannot_go_on_the_wire_names_the_field(spec: JobSpec, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        spec_to_proto(spec)
    assert info.value.field == field


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_a_job_file_reads_as_a_job_spec_and_back_from_the_wire(path: Path) -> None:
    from rota.client import load_job_file

    spec = load_job_spec(path, base_dir=REPO)
    assert isinstance(spec, JobSpec)
    assert spec == job_spec_from_mapping(load_job_file(path), base_dir=REPO)
    # Job.spec: what the api answers reads back as the same JobSpec, field for field.
    back = spec_from_proto(spec_to_proto(spec))
    wire_gpus = 0 if spec.nodes and spec.gpus_per_node and spec.gpus == 1 else spec.gpus
    assert back == dataclasses.replace(spec, gpus=wire_gpus, command=tuple(spec.command), demand=tuple(spec.demand),
                                       gpu_types=tuple(spec.gpu_types), env=dict(spec.env),
                                       features=dict(spec.features), depends_on=tuple(
                                           Dependency(d) if isinstance(d, str) else d for d in spec.depends_on))


# The CLI passes the raw bytes through.
def test_rota_logs_writes_the_raw_chunks(monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    import argparse

    from rota.cli import commands

    class Fake:
        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def log_chunks(self, job_id: str, *, follow: bool) -> Any:
            assert (job_id, follow) == ("j-1", True)
            return iter([b"a\xff", b"b\nno newline"])

    monkeypatch.setattr(commands, "connect", lambda args: Fake())
    assert commands.logs(argparse.Namespace(id="j-1", follow=True)) == 0
    assert capsysbinary.readouterr().out == b"a\xffb\nno newline"
