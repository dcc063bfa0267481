"""The api's unary RPCs as JSON over HTTP/1.1 (the Connect protocol's unary form), for
clients that should not pay for gRPC: a `rota submit` in a shell loop spends more CPU
importing grpc (about 0.1 s) than on everything else it does.

`POST /rota.v1.JobService/SubmitJob` with `Content-Type: application/json` and the request
message in protobuf's JSON mapping answers 200 with the response message in JSON (with
`application/proto`, binary messages both ways), or an error status with `{"code": "invalid_argument", "message": ..., "field": ...}`; the
`Authorization: Bearer TOKEN` header and `Connect-Timeout-Ms` are passed on. Any unary
method of the api's own services or of those it forwards can be called this way (`buf
curl --protocol connect` and Connect clients speak it too).

Each request is passed, as bytes, to the api's own gRPC port on loopback, so a call over
HTTP meets exactly the same interceptor (authentication, deadline, metrics, error codes)
and handlers as a gRPC call: the gateway translates and decides nothing. Connections are
kept alive (HTTP/1.1's default), one request at a time each.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message

from rota.api.forward import PASSED_METADATA
from rota.common.server import FIELD_TRAILER

log = logging.getLogger(__name__)

JSON, PROTO = "application/json", "application/proto"  # Connect's unary content types
MAX_BODY_BYTES = 16 * 1024 * 1024  # an array of many tasks is still one small spec
MAX_HEADER_LINES = 100
IDLE_TIMEOUT_S = 60.0  # a kept-alive connection with nothing to say is closed after this
# Connect's HTTP status for each code (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
           415: "Unsupported Media Type", 429: "Too Many Requests", 499: "Client Closed Request",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout"}


@dataclass(frozen=True)
class UnaryMethod:
    path: str  # "/rota.v1.JobService/SubmitJob", as gRPC names it
    request: type[Message]
    response: type[Message]


def unary_methods(files: Iterable[tuple[FileDescriptor, str]]) -> dict[str, UnaryMethod]:
    """Every unary method of the named services (file, service name), by its gRPC path."""
    found: dict[str, UnaryMethod] = {}
    for file, service_name in files:
        service = file.services_by_name[service_name]
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                continue
            path = f"/{service.full_name}/{method.name}"
            found[path] = UnaryMethod(path, message_factory.GetMessageClass(method.input_type),
                                      message_factory.GetMessageClass(method.output_type))
    return found


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> bytes:
        data = {"code": self.code, "message": self.message}
        if self.field:
            data["field"] = self.field
        return json.dumps(data).encode()


class HttpGateway:
    """Serves `methods` on `listen` by calling them on `grpc_target` (the api's own port)."""

    def __init__(self, listen: str, grpc_target: str, methods: dict[str, UnaryMethod], *,
                 default_deadline_s: float, reuse_port: bool = False) -> None:
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self.methods = methods
        self.default_deadline_s = default_deadline_s
        self.reuse_port = reuse_port
        self._target = grpc_target
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}

    async def run(self) -> None:
        """Serves until cancelled (a background task of the api's server)."""
        self._channel = grpc.aio.insecure_channel(self._target)
        server = await asyncio.start_server(self._connection, self.host or None, self.port,
                                            reuse_port=self.reuse_port or None, limit=64 * 1024)
        log.info("api serving JSON over HTTP on %s:%d", self.host, self.port)
        try:
            async with server:
                await server.serve_forever()
        finally:
            await self._channel.close(None)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT_S):
                        request = await _read_request(reader)
                except TimeoutError:
                    return
                if request is None:
                    return
                method, path, headers, body = request
                path = path.partition("?")[0]
                status, payload = await self._answer(method, path, headers, body)
                keep = headers.get("connection", "").lower() != "close"
                proto = status == 200 and headers.get("content-type", "").startswith(PROTO)
                writer.write(_response(status, payload, keep, PROTO if proto else JSON))
                await writer.drain()
                if not keep:
                    return
        except HttpError as exc:  # a request that could not be read: answered, then closed
            await _last_word(writer, exc)
        except (ValueError, asyncio.LimitOverrunError):  # a line longer than the reader's limit
            await _last_word(writer, HttpError(400, "invalid_argument", "a request or header line is too long"))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        try:
            return 200, await self._call(method, path, headers, body)
        except HttpError as exc:
            return exc.status, exc.body()

    async def _call(self, verb: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        method = self.methods.get(path)
        if method is None:
            raise HttpError(404, "not_found", f"{path}: no such method (POST /PACKAGE.SERVICE/METHOD)")
        if verb != "POST":
            raise HttpError(405, "unimplemented", f"{verb} {path}: only POST")
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in (JSON, PROTO):
            raise HttpError(415, "invalid_argument", f"Content-Type: {JSON} or {PROTO} (got {content_type!r})")
        if content_type == JSON:
            request = method.request()
            try:
                json_format.Parse(body or b"{}", request)
            except json_format.ParseError as exc:
                raise HttpError(400, "invalid_argument", f"request body: {exc}", field="request") from exc
            body = request.SerializeToString()
        # application/proto passes as it came: the api's gRPC port parses it (and answers
        # INVALID_ARGUMENT... or INTERNAL for bytes that are no message, as gRPC does).
        metadata = [(k, headers[k]) for k in PASSED_METADATA if k in headers]  # as the forwarder passes them
        try:
            reply: bytes = await self._unary(path)(body, timeout=self._timeout(headers), metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise _from_rpc_error(exc) from None
        if content_type == PROTO:
            return reply
        return json_format.MessageToJson(method.response.FromString(reply), indent=None).encode()

    def _unary(self, path: str) -> Any:
        call = self._calls.get(path)
        if call is None:
            assert self._channel is not None
            call = self._calls[path] = self._channel.unary_unary(path, None, None)  # bytes in, bytes out
        return call

    def _timeout(self, headers: dict[str, str]) -> float:
        raw = headers.get("connect-timeout-ms", "")
        if not raw:
            return self.default_deadline_s
        if not raw.isdigit() or len(raw) > 10:
            raise HttpError(400, "invalid_argument", f"Connect-Timeout-Ms: a whole number of milliseconds (got {raw!r})")
        return max(0.001, min(int(raw) / 1000, self.default_deadline_s))


async def _last_word(writer: asyncio.StreamWriter, error: HttpError) -> None:
    try:
        writer.write(_response(error.status, error.body(), keep_alive=False, content_type=JSON))
        await writer.drain()
    except ConnectionError:
        pass


def _from_rpc_error(exc: grpc.aio.AioRpcError) -> HttpError:
    code = exc.code()
    trailers: Any = exc.trailing_metadata() or ()
    field = next((str(v) for k, v in trailers if k == FIELD_TRAILER), "")
    return HttpError(HTTP_STATUS.get(code, 500), code.name.lower(), exc.details() or code.name, field)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    """One request (verb, path, lower-cased headers, body), or None at a clean end of the connection."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "invalid_argument", "not an HTTP/1.x request line")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise HttpError(400, "invalid_argument", f"malformed header line {raw[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    else:
        raise HttpError(400, "invalid_argument", f"more than {MAX_HEADER_LINES} header lines")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, "invalid_argument", "Transfer-Encoding: chunked is not accepted; send Content-Length")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise HttpError(400, "invalid_argument", f"Content-Length: not a number ({length_text!r})")
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, "resource_exhausted", f"request body: at most {MAX_BODY_BYTES} bytes")
    body = await reader.readexactly(length) if length else b""
    return parts[0], parts[1], headers, body


def _response(status: int, body: bytes, keep_alive: bool, content_type: str) -> bytes:
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + body
