"""A node's GPU types and labels through the api on a real PostgreSQL and Redis: what an agent
registers (NodeService.Register) is what
ListNodes, the SDK and `rota nodes --json` read back; a re-registration replaces it; a bad
type or label is INVALID_ARGUMENT naming the field, and nothing of it is stored."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from rota.api.service import ApiContext, ClusterService, NodeService
from rota.cli import commands
from rota.client import Client, Node
from rota.cluster.planner_view import live_view
from rota.common.agents import AgentClients
from rota.common.bootstrap import TokenAuthenticator
from rota.common.config import Settings
from rota.common.db import Database
from rota.common.live import LiveState, connect_redis
from rota.common.server import RotaInterceptor, Serving, start_server
from rota.v1 import api_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)
METADATA = (("authorization", f"Bearer {ADMIN}"),)


class Api:
    """The api's ClusterService and NodeService on one plaintext port, on a loop thread."""

    def __init__(self, db: Database, live: LiveState) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        ctx = ApiContext(Settings(admin_token=ADMIN, redis_prefix=live.prefix), db, live, AgentClients(ADMIN))
        self.db = db

        def register(server: grpc.aio.Server) -> list[str]:
            api_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterService(ctx), server)
            node_pb2_grpc.add_NodeServiceServicer_to_server(NodeService(ctx), server)
            return []

        async def start() -> Serving:
            interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db),
                                          default_deadline_s=20)
            return await start_server(listen="127.0.0.1:0", register=register, interceptor=interceptor,
                                      max_message_bytes=1 << 22)

        self.serving = asyncio.run_coroutine_threadsafe(start(), self.loop).result(20)
        self.target = f"127.0.0.1:{self.serving.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.serving.server.stop(0), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def api(databases: Any, redis_url: str) -> Iterator[Api]:
    with databases.migrated() as db:
        live = LiveState(connect_redis(redis_url), "rota-test:" + secrets.token_hex(4))
        running = Api(db, live)
        try:
            yield running
        finally:
            running.stop()
            live.client.close()


def node(name: str, types: list[str], labels: dict[str, str]) -> common_pb2.Node:
    gpus = [common_pb2.Gpu(index=i, uuid=f"{name}-{i}", model="virtual (CPU)", virtual=True, type=t)
            for i, t in enumerate(types)]
    return common_pb2.Node(name=name, address=f"127.0.0.1:{40000 + len(name)}", gpus=gpus, labels=labels)


def register(api: Api, message: common_pb2.Node) -> common_pb2.Node:
    with grpc.insecure_channel(api.target) as channel:
        reply = node_pb2_grpc.NodeServiceStub(channel).Register(
            node_pb2.NodeServiceRegisterRequest(node=message), timeout=10, metadata=METADATA)
    return reply.node


def listed(api: Api, name: str) -> Node:
    with Client.connect(api.target, token=ADMIN, timeout=timedelta(seconds=10)) as client:
        return next(n for n in client.nodes() if n.name == name)


def test_registered_types_and_labels_are_read_back(api: Api) -> None:
    answer = register(api, node("typed-1", ["a100", "a100"], {"switch": "s1", "rack": "r-2"}))
    assert [g.type for g in answer.gpus] == ["a100", "a100"]
    assert dict(answer.labels) == {"switch": "s1", "rack": "r-2"}

    found = listed(api, "typed-1")
    assert [g.type for g in found.gpus] == ["a100", "a100"]
    assert found.labels == {"switch": "s1", "rack": "r-2"}
    assert (found.switch, found.gpu_types) == ("s1", ["a100"])
    out = found.to_dict()
    assert out["labels"] == {"switch": "s1", "rack": "r-2"}
    assert [g["type"] for g in out["gpus"]] == ["a100", "a100"]


def test_a_re_registration_replaces_types_and_labels(api: Api) -> None:
    register(api, node("typed-2", ["v100"], {"switch": "s1"}))
    register(api, node("typed-2", ["h100", "h100"], {"switch": "s2", "rack": "r1"}))
    found = listed(api, "typed-2")
    assert [g.type for g in found.gpus] == ["h100", "h100"]
    assert found.labels == {"switch": "s2", "rack": "r1"}
    register(api, node("typed-2", [""], {}))  # a virtual slot that declares nothing
    found = listed(api, "typed-2")
    assert ([g.type for g in found.gpus], found.labels, found.gpu_types, found.switch) == ([""], {}, [], "")


@pytest.mark.parametrize(("types", "labels", "field"), [
    (["A100"], {}, "node.gpus[0].type"),
    (["a100", "a" * 33], {}, "node.gpus[1].type"),
    (["a100"], {"Switch": "s1"}, "node.labels[Switch]"),
    (["a100"], {"switch": "s 1"}, "node.labels[switch]"),
    (["a100"], {"switch": ""}, "node.labels[switch]"),
    (["a100"], {"rack": "r" * 64}, "node.labels[rack]"),
])
def test_a_bad_type_or_label_is_invalid_argument_naming_the_field(
    api: Api, types: list[str], labels: dict[str, str], field: str,
) -> None:
    name = "bad-" + secrets.token_hex(3)
    with pytest.raises(grpc.RpcError) as caught:
        register(api, node(name, types, labels))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field + ":")
    with Client.connect(api.target, token=ADMIN, timeout=timedelta(seconds=10)) as client:
        assert name not in {n.name for n in client.nodes()}


def test_rota_nodes_shows_the_type_and_switch(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    register(api, node("typed-4", ["h100", "h100"], {"switch": "s4"}))
    args = argparse.Namespace(endpoint=api.target, token=ADMIN, home=None, json=False)
    assert commands.nodes(args) == 0
    lines = capsys.readouterr().out.splitlines()
    header, row = lines[0].split(), next(line.split() for line in lines if line.startswith("typed-4 "))
    assert header[:6] == ["NODE", "HEALTH", "ADDRESS", "GPUS", "TYPE", "SWITCH"]
    assert row[3:6] == ["2", "h100", "s4"]

    assert commands.nodes(argparse.Namespace(**{**vars(args), "json": True})) == 0
    out = next(n for n in json.loads(capsys.readouterr().out) if n["name"] == "typed-4")
    assert out["labels"] == {"switch": "s4"}
    assert [g["type"] for g in out["gpus"]] == ["h100", "h100"]


def test_a_node_registers_its_cpu_and_memory_capacity_for_the_plan(api: Api, databases: Any) -> None:
    """What the agent reports (discovered, or --cpus/--memory) is stored and planned with."""
    message = node("cap-1", ["a100"], {})
    message.cpus, message.memory_bytes = 16.0, 64 << 30
    answer = register(api, message)
    assert (answer.cpus, answer.memory_bytes) == (16.0, 64 << 30)
    with api.db.session() as session:
        live = next(n for n in live_view(session).nodes if n.name == "cap-1")
    assert (live.cpus, live.memory_bytes) == (16.0, 64 << 30)
    found = listed(api, "cap-1")  # the SDK, and `rota nodes --json`
    assert (found.cpus, found.memory_bytes) == (16.0, 64 << 30)
    assert (found.to_dict()["cpus"], found.to_dict()["memory_bytes"]) == (16.0, 64 << 30)
    message.cpus, message.memory_bytes = 8.0, 0  # re-registered with less (memory not reported)
    again = register(api, message)
    assert (again.cpus, again.memory_bytes) == (8.0, 0)


@pytest.mark.parametrize(("cpus", "memory", "field"), [(-1.0, 0, "node.cpus"), (float("nan"), 0, "node.cpus"),
                                                        (4.0, -1, "node.memory_bytes")])
def test_a_negative_capacity_is_invalid_argument_naming_the_field(api: Api, cpus: float, memory: int, field: str) -> None:
    message = node("cap-bad", ["a100"], {})
    message.cpus, message.memory_bytes = cpus, memory
    with pytest.raises(grpc.RpcError) as caught:
        register(api, message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field + ":")
