"""Every request message of every service, fuzzed against a real local cluster.

Whatever the bytes say, a call gets a deliberate answer: never INTERNAL or UNKNOWN (a
crash), and an INVALID_ARGUMENT always names the field (the `rota-field` trailer).
Calls go through the api's one endpoint as the admin (the widest surface).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cluster import RunningCluster, own_cluster
from fuzzing import messages
from google.protobuf import symbol_database
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import HealthCheck, given, settings

from rota.v1 import allocator_pb2, api_pb2, checkpoint_pb2, detector_pb2, forecaster_pb2, ledger_pb2

FILES = (api_pb2, allocator_pb2, forecaster_pb2, ledger_pb2, checkpoint_pb2, detector_pb2)
DELIBERATE = {
    "OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "FAILED_PRECONDITION",
    "UNIMPLEMENTED", "RESOURCE_EXHAUSTED", "OUT_OF_RANGE",
}
METHODS: list[MethodDescriptor] = [
    m for f in FILES for s in f.DESCRIPTOR.services_by_name.values() for m in s.methods if not m.client_streaming
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "fuzz")


@pytest.fixture(scope="module")
def channel(cluster: RunningCluster) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(cluster.info["endpoint"]) as ch:
        yield ch


def _call(channel: grpc.Channel, method: MethodDescriptor, request: Any, token: str) -> tuple[str, dict[str, str]]:
    path = f"/{method.containing_service.full_name}/{method.name}"
    reply_cls = symbol_database.Default().GetSymbol(method.output_type.full_name)
    meta = (("authorization", f"Bearer {token}"),)
    try:
        if method.server_streaming:
            stream = channel.unary_stream(path, lambda m: m.SerializeToString(), reply_cls.FromString)
            call = stream(request, timeout=1.5, metadata=meta)
            next(iter(call), None)
            call.cancel()
        else:
            unary = channel.unary_unary(path, lambda m: m.SerializeToString(), reply_cls.FromString)
            unary(request, timeout=15, metadata=meta)
    except grpc.RpcError as exc:
        if method.server_streaming and exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return "OK", {}  # a stream that waits for events is a deliberate answer
        return exc.code().name, dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    return "OK", {}


@pytest.mark.parametrize("method", METHODS, ids=[f"{m.containing_service.name}.{m.name}" for m in METHODS])
def test_every_request_gets_a_deliberate_status_and_bad_input_names_its_field(
    method: MethodDescriptor, channel: grpc.Channel, cluster: RunningCluster
) -> None:
    request_cls = symbol_database.Default().GetSymbol(method.input_type.full_name)
    token = cluster.token

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(messages(request_cls))
    def check(request: Any) -> None:
        code, trailers = _call(channel, method, request, token)
        assert code in DELIBERATE, f"{method.full_name} answered {code} to {request}"
        if code == "INVALID_ARGUMENT":
            assert trailers.get("rota-field"), f"{method.full_name}: INVALID_ARGUMENT without a field for {request}"

    check()
