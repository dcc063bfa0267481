"""`rota submit` over the api's JSON-over-HTTP gateway (rota.api.http_gateway), without gRPC.

A shell loop of `rota submit` pays every call's start-up: importing grpc alone costs more
CPU than reading the job file, building the request and waiting for the commit together.
When the cluster publishes its HTTP endpoint (`cluster.json`'s `http_endpoint`, or
ROTA_HTTP_ENDPOINT) and no TLS is configured, submit, several files and `--array` go as
binary protobuf over one kept-alive HTTP/1.1 connection per thread (the same requests, the same
handlers and errors: the gateway passes them to the api's gRPC port), and this module
imports no grpc. `--wait` and `--what-if`, TLS, or a cluster without the endpoint take
the gRPC client (rota.cli.commands.submit).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from rota.cli.output import print_json
from rota.cli.running import run
from rota.client._wire import job_state, spec_to_proto
from rota.client.arrays import JobArray, array_request
from rota.client.errors import RotaError, UnavailableError, error_of
from rota.client.home import NoClusterError, resolve_connection
from rota.client.jobfile import job_spec_from_mapping, load_job_file
from rota.client.jobspec import JobSpec
from rota.v1 import api_pb2

TIMEOUT_S = 30.0  # as the gRPC client's default deadline for a CLI call
CONCURRENCY = 16  # several files: connections in flight, so the api commits them as one batch


def spec_of(path: str, tenant: str | None) -> JobSpec:
    """A job file as the spec to submit, `--tenant` over the file's; what could not be put
    on the wire at all (features that are not JSON) is refused here, before anything is sent."""
    data = load_job_file(path)
    if tenant:
        data["tenant"] = tenant
    spec = job_spec_from_mapping(data, base_dir=Path.cwd())
    spec_to_proto(spec)
    return spec


def specs_of(args: argparse.Namespace) -> list[JobSpec]:
    """Every file of `rota submit`, read and checked before anything is sent (a bad one
    submits nothing), with `--tenant` and `--after` applied: both transports' specs."""
    from rota.cli import array_commands

    after = getattr(args, "after", None)
    return [array_commands.with_after(spec_of(path, args.tenant), after) for path in args.files]


def print_submitted(args: argparse.Namespace, job_id: str, name: str, state: str) -> None:
    """What `rota submit FILE` prints for one new job, over gRPC or HTTP alike."""
    if args.json:
        print_json({"id": job_id, "state": state})
    else:
        print(f"submitted {job_id} ({name}, {state})")


def print_rows(args: argparse.Namespace, answers: list[tuple[str, str] | RotaError]) -> int:
    """Several files' outcomes, (id, state) or the error, in the order of args.files: JSON
    rows or a line each; every refusal on stderr naming its file; 1 if any was refused."""
    rows = [({"id": a[0], "state": a[1], "file": path} if isinstance(a, tuple) else
             {"file": path, "error": f"{a.code}: {a}"}) for a, path in zip(answers, args.files, strict=True)]
    if args.json:
        print_json(rows)
    for row in rows:
        if "error" in row:
            print(f"rota: {row['file']}: {row['error']}", file=sys.stderr)
        elif not args.json:
            print(f"submitted {row['id']} ({row['state']}) from {row['file']}")
    return 1 if any("error" in row for row in rows) else 0


def main(args: argparse.Namespace) -> int | None:
    """Submits over HTTP and returns the exit status, or None when this call needs the
    gRPC client (nothing has been sent then)."""
    if args.what_if or args.wait:
        return None
    try:
        connection = resolve_connection(endpoint=args.endpoint, token=args.token, home=args.home)
    except NoClusterError:
        return None  # the gRPC path reports it, with the same message
    if not connection.http_endpoint or connection.tls is not None:
        return None
    api = HttpApi(connection.http_endpoint, connection.token)
    return run(lambda parsed: _submit(parsed, api), args)  # errors as the gRPC path reports them


def _submit(args: argparse.Namespace, api: HttpApi) -> int:
    from rota.cli import array_commands  # --array, as the gRPC path reads it

    specs = specs_of(args)
    indices = array_commands.array_text(args)
    if indices is not None:
        array_commands.check_array_flags(args)
        request = array_request(specs[0], indices, None, args.request_id)
        reply = api.call("JobService/SubmitJobArray", request, api_pb2.SubmitJobArrayResponse())
        return array_commands.print_array(args, JobArray._from_proto(reply.array))
    if len(specs) > 1:
        if args.request_id:
            raise ValueError(f"--request-id: one FILE at a time (got {len(specs)})")
        return print_rows(args, _submit_many(api, specs))
    job = _submit_one(api, specs[0], args.request_id)
    if isinstance(job, RotaError):
        raise job
    print_submitted(args, job[0], specs[0].name, job[1])
    return 0


def _submit_one(api: HttpApi, spec: JobSpec, request_id: str | None) -> tuple[str, str] | RotaError:
    request = api_pb2.SubmitJobRequest(spec=spec_to_proto(spec), request_id=request_id or str(uuid.uuid4()))
    try:
        job = api.call("JobService/SubmitJob", request, api_pb2.SubmitJobResponse()).job
    except RotaError as exc:
        return exc
    return job.id, job_state(job.state)


def _submit_many(api: HttpApi, specs: list[JobSpec]) -> list[tuple[str, str] | RotaError]:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    own = threading.local()  # one connection per thread: HTTP/1.1 answers one request at a time

    def send(spec: JobSpec) -> tuple[str, str] | RotaError:
        if not hasattr(own, "api"):
            own.api = api.another()
        return _submit_one(own.api, spec, None)

    with ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(specs))) as pool:
        return list(pool.map(send, specs))


class HttpApi:
    """The api's unary RPCs over one kept-alive HTTP/1.1 connection, messages as binary
    protobuf (`application/proto`: nothing to convert on either side). Not thread-safe:
    `another()` for each thread. A plain socket, not http.client: the CLI pays for every
    module it imports on every call, and http.client brings the email package."""

    def __init__(self, base_url: str, token: str) -> None:
        scheme, _, rest = base_url.partition("://")
        address, _, prefix = rest.partition("/")
        host, _, port = address.rpartition(":")
        if scheme != "http" or not host or not port.isdigit():
            raise ValueError(f"ROTA_HTTP_ENDPOINT: an http://HOST:PORT address (got {base_url!r})")
        self.base_url, self.token = base_url, token
        self._address = (host.strip("[]"), int(port))
        self._prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self._sock: socket.socket | None = None
        self._reader: Any = None

    def another(self) -> HttpApi:
        return HttpApi(self.base_url, self.token)

    def call(self, method: str, request: Message, response: Any) -> Any:
        """`method` ("JobService/SubmitJob") with `request`; `response` filled from the answer.
        Errors are the SDK's RotaError subclasses, as over gRPC."""
        body = request.SerializeToString()
        head = (f"POST {self._prefix}/rota.v1.{method} HTTP/1.1\r\nHost: {self._address[0]}:{self._address[1]}\r\n"
                f"Content-Type: application/proto\r\nAuthorization: Bearer {self.token}\r\n"
                f"Connect-Timeout-Ms: {int(TIMEOUT_S * 1000)}\r\nContent-Length: {len(body)}\r\n\r\n")
        try:
            status, data = self._exchange(head.encode("latin-1") + body)
        except OSError as exc:
            self.close()
            raise UnavailableError(f"api unavailable at {self.base_url}: {exc}") from exc
        if status != 200:
            raise _error_of(status, data)
        response.ParseFromString(data)
        return response

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._sock is None:
            self._sock = socket.create_connection(self._address, timeout=TIMEOUT_S)
            self._reader = self._sock.makefile("rb")
        self._sock.sendall(request)
        status_line = self._reader.readline(65536).split()
        if len(status_line) < 2 or not status_line[1].isdigit():
            raise OSError(f"not an HTTP answer: {b' '.join(status_line)[:80]!r}")
        length, close = 0, False
        while (line := self._reader.readline(65536)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        data = self._reader.read(length) if length else b""
        if len(data) != length:
            raise OSError("the api closed the connection mid-answer")
        if close:
            self.close()
        return int(status_line[1]), data

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._reader = None


def _error_of(status: int, data: bytes) -> RotaError:
    try:
        error = json.loads(data)
        code, message, field = str(error["code"]).upper(), str(error.get("message", "")), str(error.get("field", ""))
    except (ValueError, KeyError, TypeError):
        return error_of("UNKNOWN", f"HTTP {status}: {data[:200]!r}")
    return error_of(code, message, field)
