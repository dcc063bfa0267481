"""Checkpoints of a gang on a real PostgreSQL, with scripted agents (one per node): every
node is asked for its rank group under one request number, the parts join into one
image, a failed node fails the whole operation, and a paused gang resumes from it."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from rota import imageformat
from rota.allocator.loop import SchedulingLoop
from rota.api import repository as api
from rota.checkpoint import repository as repo
from rota.checkpoint.coordinator import AgentCallFailed, Coordinator
from rota.cluster import heartbeats, job_starts, node_lifecycle, submissions
from rota.cluster.job_lifecycle import Events, get_job
from rota.cluster.models import GpuClaimRow, GpuRow
from rota.common import read_models
from rota.common.db import Database
from rota.core import jobstate as js
from rota.core.errors import FailedPrecondition
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning.liveplan import Start
from rota.imagestore.chunks import FileChunkStore
from rota.imagestore.images import join_parts, materialize, write_staged
from rota.imagestore.settings import CheckpointSettings
from rota.v1 import agent_pb2

WORLD = 4  # 2 nodes x 2 ranks


class GangAgents:
    """Every node's agent: each stages only the ranks it is asked for into the shared store."""

    def __init__(self, store: FileChunkStore, work: Path) -> None:
        self.store = store
        self.work = work
        self.asked: dict[str, agent_pb2.AgentCheckpointRequest] = {}
        self.images: dict[tuple[str, str], agent_pb2.AgentImageStatusResponse] = {}
        self.fail_on: dict[str, AgentCallFailed] = {}
        self.model = torch.randn(100_000, generator=torch.Generator().manual_seed(secrets.randbits(40)))

    async def checkpoint(self, address: str, request: agent_pb2.AgentCheckpointRequest,
                         timeout_s: float) -> agent_pb2.AgentCheckpointResponse:
        self.asked[address] = request
        if address in self.fail_on:
            raise self.fail_on[address]
        ranks = list(request.local_ranks)
        folder = self.work / address.replace(":", "_") / request.image_id
        for rank in ranks:  # replicated model, per-rank RNG
            imageformat.stage(folder, rank, WORLD, 30, {"object:model": self.model, "rng": torch.full((4,), float(rank))},
                           frozenset({"object:model"}))
        written = write_staged(self.store, folder, ranks, 64 * 1024)
        self.images[(address, request.image_id)] = agent_pb2.AgentImageStatusResponse(
            image_state=2, manifest_json=json.dumps(written.manifest).encode(), logical_bytes=written.logical_bytes,
            written_bytes=written.written_bytes, chunks=written.chunks, write_seconds=written.seconds, step=30,
            ranks=len(ranks),
        )
        return agent_pb2.AgentCheckpointResponse(
            image_id=request.image_id, registered=True, step=30, ranks=len(ranks), logical_bytes=written.logical_bytes,
            copy_seconds=0.01, pause_seconds=0.03 if request.pause else 0.0)

    async def image_status(self, address: str, image_id: str) -> agent_pb2.AgentImageStatusResponse:
        return self.images.get((address, image_id), agent_pb2.AgentImageStatusResponse(image_state=4))


@pytest.fixture(scope="module")
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as database:
        yield database


@pytest.fixture
def agents(tmp_path: Path) -> GangAgents:
    return GangAgents(FileChunkStore(tmp_path / "chunks", fsync=False), tmp_path / "staged")


def coordinator(db: Database, agents: GangAgents) -> Coordinator:
    return Coordinator(db, agents, CheckpointSettings(store_dir=agents.store.root, timeout_s=1.0), poll_s=0.01)


def running_gang(db: Database) -> tuple[str, list[str]]:
    """A RUNNING 2-node x 2-GPU gang; its nodes (addresses 127.0.0.1:<10+i>) in rank order."""
    tenant = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, tenant, 1.0, secrets.token_hex(32)))
    nodes = [f"g{i}-{secrets.token_hex(3)}" for i in range(2)]
    for i, node in enumerate(nodes):
        gpus = [GpuRow(node=node, index=g, uuid=f"{node}-{g}", model="virtual", virtual=True) for g in range(2)]
        db.run(lambda s, n=node, a=f"127.0.0.1:{10 + i}", g=gpus: node_lifecycle.register(s, n, a, g))
    spec = validate(JobSpecData(name="gang", tenant=tenant, kind="training", priority=5, nodes=2, gpus_per_node=2,
                                command=["true"]), max_gpus_per_node=2)
    job, _ = db.run(lambda s: submissions.submit_job(s, spec, "", Events()))
    placed = db.run(lambda s: job_starts.commit_decision(s, Start(job.id, nodes[0], (0, 1), tuple(nodes)), Events()))
    assert placed is not None
    for node in nodes:
        report = heartbeats.JobReport(job.id, placed.epoch, js.RUNNING, 0, "", {"step": 30} if node == nodes[0] else None)
        db.run(lambda s, n=node, r=report: heartbeats.heartbeat(s, n, [r], Events()))
    return str(job.id), nodes


async def settled(c: Coordinator, coro: Any) -> Any:
    result = await coro
    while c.tasks:
        await asyncio.gather(*list(c.tasks))
    return result


def claims(db: Database, job_id: str) -> list[GpuClaimRow]:
    return list(db.run(lambda s: s.scalars(select(GpuClaimRow).where(GpuClaimRow.job_id == job_id)).all()))


def test_a_gang_pauses_as_one_image_of_every_rank_and_resumes_from_it(db: Database, agents: GangAgents,
                                                                      tmp_path: Path) -> None:
    job_id, nodes = running_gang(db)
    c = coordinator(db, agents)
    op = asyncio.run(settled(c, c.pause(job_id)))
    # 1. Both nodes were asked, for their own ranks, under one request number.
    asked = [agents.asked["127.0.0.1:10"], agents.asked["127.0.0.1:11"]]
    assert [list(r.local_ranks) for r in asked] == [[0, 1], [2, 3]]
    assert {r.seq for r in asked} == {op.id} and all(r.pause for r in asked)
    # 2. Paused: no GPU held on either node; the image is complete, with all four ranks.
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == js.PAUSED and job.gang_nodes == [] and claims(db, job_id) == []
    image = db.run(lambda s: repo.latest_image(s, job_id))
    assert image is not None and image.state == repo.COMPLETE and image.ranks == WORLD and image.step == 30
    assert image.stored_bytes < 0.6 * image.logical_bytes  # the replicated model once, across both nodes
    # 3. The joined manifest is in the store: a restore gives every rank its state.
    manifest = json.loads(agents.store.get_manifest(image.id))
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1, 2, 3]
    materialize(agents.store, manifest, tmp_path / "restore")
    for rank in range(WORLD):
        _index, state = imageformat.load(tmp_path / "restore", rank)
        assert torch.equal(state["object:model"], agents.model) and float(state["rng"][0]) == rank
    # 4. Resumed: PENDING, and every node of its next placement restores from that image.
    resumed, placed = asyncio.run(settled(c, c.resume(job_id)))
    assert resumed.state == repo.DONE and placed.state == js.PENDING
    request = db.run(lambda s: SchedulingLoop._commit_start(s, Start(job_id, nodes[1], (0, 1), (nodes[1], nodes[0])),
                                                              Events()))
    assert request is not None and request.resume_image == image.id


def test_one_node_failing_fails_the_gangs_checkpoint_and_the_gang_runs_on(db: Database, agents: GangAgents) -> None:
    job_id, nodes = running_gang(db)
    before = db.run(lambda s: repo.latest_image(s, job_id))
    agents.fail_on["127.0.0.1:11"] = AgentCallFailed("rank 3 of 4 failed to copy its state: OSError: disk full")
    c = coordinator(db, agents)
    op = asyncio.run(settled(c, c.checkpoint(job_id)))
    assert op.state == repo.FAILED and nodes[1] in (op.error or "") and "disk full" in (op.error or "")
    assert nodes[0] not in (op.error or "")  # the node that copied is not blamed
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == js.RUNNING and job.gang_nodes == nodes and len(claims(db, job_id)) == 4
    assert db.run(lambda s: repo.active_operations(s, job_id)) == []
    assert db.run(lambda s: repo.latest_image(s, job_id)) == before  # no half image counts


def test_a_gang_is_migrated_by_the_plan_never_to_one_node(db: Database, agents: GangAgents) -> None:
    job_id, nodes = running_gang(db)
    c = coordinator(db, agents)
    with pytest.raises(FailedPrecondition, match="migrate it without a node"):
        asyncio.run(settled(c, c.migrate(job_id, node=nodes[1])))
    done, placed = asyncio.run(settled(c, c.migrate(job_id)))
    assert done.state == repo.DONE and placed.state == js.PENDING
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == done.image_id


def test_a_paused_exit_reported_by_one_node_pauses_the_whole_gang(db: Database) -> None:
    job_id, nodes = running_gang(db)
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None
    report = heartbeats.JobReport(job_id, job.epoch, js.PAUSED, 0, "", None)
    db.run(lambda s: heartbeats.heartbeat(s, nodes[1], [report], Events()))
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == js.PAUSED and "all 2 nodes" in job.reason
    assert claims(db, job_id) == [] and job.gang_nodes == []


def test_join_parts_refuses_parts_that_do_not_make_one_image() -> None:
    part = {"chunk_size": 4, "ranks": [{"rank": 0}, {"rank": 1}]}
    assert [r["rank"] for r in join_parts([{"chunk_size": 4, "ranks": [{"rank": 2}, {"rank": 3}]}, part])["ranks"]] \
        == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not each of"):
        join_parts([part, part])
    with pytest.raises(ValueError, match="chunk sizes"):
        join_parts([part, {"chunk_size": 8, "ranks": [{"rank": 2}]}])
