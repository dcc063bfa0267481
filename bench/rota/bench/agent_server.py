"""A node agent's AgentService on a real gRPC port, in this process, on a loop thread of its
own: the source side of a streaming migration for the checkpoint bench and the tests, which
drive the agents' checkpoint managers directly instead of starting `rota agent`."""

from __future__ import annotations

import asyncio
import threading

import grpc
from opentelemetry import trace

from rota.agent.checkpoints import AgentCheckpoints
from rota.agent.service import AgentRuntime, AgentService
from rota.common.auth import ADMIN, Identity
from rota.common.server import RotaInterceptor, Serving, start_server
from rota.v1 import agent_pb2_grpc


class AgentServer:
    """Serves `checkpoints`' node as `rota agent` does: the admin token only."""

    def __init__(self, checkpoints: AgentCheckpoints, admin_token: str, port: int = 0) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="agent-server")
        self.thread.start()
        runtime = AgentRuntime(checkpoints.table.node, checkpoints.table, virtual=True, checkpoints=checkpoints)

        async def admin_only(token: str) -> Identity | None:
            return Identity(ADMIN) if token == admin_token else None

        def register(server: grpc.aio.Server) -> list[str]:
            agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(runtime), server)
            return []

        async def start() -> Serving:
            interceptor = RotaInterceptor(tracer=trace.get_tracer("rota.bench"), authenticate=admin_only,
                                          default_deadline_s=20)
            return await start_server(listen=f"127.0.0.1:{port}", register=register, interceptor=interceptor,
                                      max_message_bytes=1 << 22)

        self.serving = asyncio.run_coroutine_threadsafe(start(), self.loop).result(20)
        self.address = f"127.0.0.1:{self.serving.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.serving.server.stop(0), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
