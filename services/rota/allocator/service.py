"""AllocatorService adapter. Explain answers from the live plan; Plan and WhatIf belong to
the constraint-aware planner issue and answer UNIMPLEMENTED until then."""

from __future__ import annotations

import asyncio

import grpc

from rota.common.auth import current_identity
from rota.common.db import Database
from rota.common.errors import NotFound
from rota.common.jobs_repo import get_job
from rota.v1 import allocator_pb2, allocator_pb2_grpc


class AllocatorService(allocator_pb2_grpc.AllocatorServiceServicer):
    def __init__(self, db: Database) -> None:
        self.db = db

    async def Explain(self, request: allocator_pb2.ExplainRequest, context: grpc.aio.ServicerContext) -> allocator_pb2.ExplainResponse:
        identity = current_identity()
        job = await asyncio.to_thread(self.db.run, lambda s: get_job(s, request.job_id))
        if job is None or not identity.may_access(job.tenant):
            raise NotFound(f"job {request.job_id} not found")
        return allocator_pb2.ExplainResponse(job_id=job.id, reason=job.reason)
