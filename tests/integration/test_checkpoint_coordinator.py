"""The checkpoint coordinator on a real PostgreSQL, with a scripted agent: manifests and
chunk references, durable operations, a coordinator restarted mid-operation, retention and
garbage collection, and what the allocator and the api read from it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select, update

from rota import imageformat
from rota.allocator.loop import SchedulingLoop
from rota.api import repository as api
from rota.checkpoint import gc
from rota.checkpoint import repository as repo
from rota.checkpoint.coordinator import AgentCallFailed, Coordinator
from rota.checkpoint.models import ImageRow, ManifestRow, OperationRow
from rota.cluster import heartbeats, job_starts, node_lifecycle, submissions
from rota.cluster.job_lifecycle import Events, get_job, lose
from rota.cluster.models import GpuClaimRow, GpuRow, PlacementRow
from rota.common import read_models
from rota.common.db import Database
from rota.core import jobstate as js
from rota.core.errors import AlreadyExists
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning.liveplan import Start
from rota.imagestore.chunks import FileChunkStore
from rota.imagestore.images import chunk_digests, digest_of, materialize, write_staged
from rota.imagestore.settings import CheckpointSettings
from rota.v1 import agent_pb2


class ScriptedAgent:
    """Answers as an agent would: takes a real two-rank copy into a real chunk store."""

    def __init__(self, store: FileChunkStore, work: Path) -> None:
        self.store = store
        self.work = work
        self.images: dict[str, agent_pb2.AgentImageStatusResponse] = {}
        self.error: AgentCallFailed | None = None
        self.step = 0
        self.seed = secrets.randbits(48)
        self.calls: list[agent_pb2.AgentCheckpointRequest] = []  # every Checkpoint the agent was asked
        self.delay_s = 0.0
        self.writing = False  # True: every write reads as still going on
        self.write_error = ""  # set: every write reads as failed with this reason

    def take(self, image_id: str) -> agent_pb2.AgentImageStatusResponse:
        self.step += 10
        gen = torch.Generator().manual_seed(self.seed + self.step)  # bytes of this test's own
        state = {"object:model": torch.randn(200_000, generator=gen), "rng": torch.randn(10, generator=gen)}
        folder = self.work / image_id
        for rank in range(2):  # replicated model, per-rank RNG
            imageformat.stage(folder, rank, 2, self.step, {**state, "rng": torch.full((10,), float(rank))})
        written = write_staged(self.store, folder, 2, 64 * 1024)
        self.store.put_manifest(image_id, b"{}")
        status = agent_pb2.AgentImageStatusResponse(
            image_state=2, manifest_json=json.dumps(written.manifest).encode(), logical_bytes=written.logical_bytes,
            written_bytes=written.written_bytes, chunks=written.chunks, write_seconds=written.seconds,
            step=self.step, ranks=2,
        )
        self.images[image_id] = status
        return status

    async def checkpoint(self, address: str, request: agent_pb2.AgentCheckpointRequest,
                         timeout_s: float) -> agent_pb2.AgentCheckpointResponse:
        self.calls.append(request)
        if self.error is not None:
            raise self.error
        await asyncio.sleep(self.delay_s)  # an agent takes a moment: a repeat may arrive while it copies
        status = self.take(request.image_id)
        return agent_pb2.AgentCheckpointResponse(
            image_id=request.image_id, registered=True, step=status.step, ranks=2, logical_bytes=status.logical_bytes,
            copy_seconds=0.01, pause_seconds=0.02 if request.pause else 0.0,
        )

    async def image_status(self, address: str, image_id: str) -> agent_pb2.AgentImageStatusResponse:
        status = self.images.get(image_id, agent_pb2.AgentImageStatusResponse(image_state=4))
        if status.image_state == 2 and self.write_error:
            return agent_pb2.AgentImageStatusResponse(image_state=3, error=self.write_error)
        if status.image_state == 2 and self.writing:  # the background write is still going on
            return agent_pb2.AgentImageStatusResponse(image_state=1, step=status.step, ranks=2)
        return status


@pytest.fixture(scope="module")
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as database:  # retention and GC read every image: a database of our own
        yield database


@pytest.fixture
def agent(tmp_path: Path) -> ScriptedAgent:
    return ScriptedAgent(FileChunkStore(tmp_path / "chunks", fsync=False), tmp_path / "staged")


def coordinator(db: Database, agent: ScriptedAgent) -> Coordinator:
    return Coordinator(db, agent, CheckpointSettings(store_dir=agent.store.root, timeout_s=1.0), poll_s=0.01)


def running_job(db: Database) -> str:
    tenant, node = "t-" + secrets.token_hex(4), "n-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, tenant, 1.0, secrets.token_hex(32)))
    gpus = [GpuRow(node=node, index=i, uuid=f"{node}-{i}", model="virtual", virtual=True) for i in range(2)]
    db.run(lambda s: node_lifecycle.register(s, node, "127.0.0.1:1", gpus))
    spec = validate(JobSpecData(name="ft", tenant=tenant, kind="training", priority=5, gpus=1, command=["true"]),
                    max_gpus_per_node=0)
    job, _ = db.run(lambda s: submissions.submit_job(s, spec, "", Events()))
    placed = db.run(lambda s: job_starts.commit_decision(s, Start(job.id, node, (1,)), Events()))
    assert placed is not None
    report = heartbeats.JobReport(job.id, placed.epoch, js.RUNNING, 0, "", {"step": 1})
    db.run(lambda s: heartbeats.heartbeat(s, node, [report], Events()))
    return str(job.id)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def settled(c: Coordinator, coro: Any) -> Any:
    """The call's answer, once every task it left behind (the background write) is done."""
    result = await coro
    while c.tasks:
        await asyncio.gather(*list(c.tasks))
    return result


def claims(db: Database, job_id: str) -> list[GpuClaimRow]:
    return list(db.run(lambda s: s.scalars(select(GpuClaimRow).where(GpuClaimRow.job_id == job_id)).all()))


def test_pause_frees_the_gpus_records_a_deduplicated_image_and_resume_restores_from_it(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    op = run(settled(c, c.pause(job_id)))
    assert op.state == repo.WRITING  # returned once the GPUs were free; the write went on
    job = db.run(lambda s: get_job(s, job_id))
    assert job is not None and job.state == js.PAUSED and job.node is None and "paused at step 10" in job.reason
    assert claims(db, job_id) == []
    placements = db.run(lambda s: s.scalars(select(PlacementRow).where(PlacementRow.job_id == job_id)).all())
    assert all(p.released_at is not None for p in placements)  # the ledger charges running time only
    image = db.run(lambda s: repo.latest_image(s, job_id))
    assert image is not None and image.state == repo.COMPLETE and image.ranks == 2 and image.step == 10
    assert db.run(lambda s: s.get(OperationRow, op.id)).state == repo.DONE
    manifests = db.run(lambda s: s.scalars(select(ManifestRow).where(ManifestRow.image_id == image.id)).all())
    assert sorted(m.rank for m in manifests) == [0, 1]
    assert image.stored_bytes < 0.6 * image.logical_bytes  # the replicated model is stored once
    cost = db.run(lambda s: read_models.checkpoint_costs(s, [job_id]))[job_id]
    assert cost.pause_s == 0.02 and cost.pauses == 1 and cost.logical_bytes == image.logical_bytes

    resumed, placed = run(settled(c, c.resume(job_id, node="n-target")))
    assert resumed.state == repo.DONE and placed.state == js.PENDING
    job = db.run(lambda s: get_job(s, job_id))
    assert job.state == js.PENDING and image.id in job.reason and "step 10" in job.reason
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == image.id
    assert db.run(lambda s: read_models.pending_resume_targets(s).get(job_id)) == "n-target"

    # The allocator's launch carries the image to the agent.
    node = placements[0].node
    request = db.run(lambda s: SchedulingLoop._commit_start(s, Start(job_id, node, (0,)), Events()))
    assert request.resume_image == image.id


def test_a_pause_no_rank_acknowledges_fails_and_the_job_runs_on_with_its_last_image(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    good = run(settled(c, c.checkpoint(job_id)))
    assert good.state == repo.DONE
    agent.error = AgentCallFailed("ranks [1] of 2 did not reach a safe point within 1s; every rank carries on")
    op = run(settled(c, c.pause(job_id)))
    assert op.state == repo.FAILED and "ranks [1] of 2" in op.error and good.image_id in op.error
    job = db.run(lambda s: get_job(s, job_id))
    assert job.state == js.RUNNING and len(claims(db, job_id)) == 1
    assert db.run(lambda s: s.get(ImageRow, op.image_id)).state == repo.FAILED
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == good.image_id


def start_op(db: Database, c: Coordinator, job_id: str, kind: str, state: str) -> OperationRow:
    op, _ = db.run(lambda s: c._start(s, job_id, kind, "", "", 0.2))
    db.run(lambda s: repo.set_operation(s, op.id, state))
    return op


def test_a_restarted_coordinator_finishes_a_pause_the_agent_had_taken(db: Database, agent: ScriptedAgent) -> None:
    job_id = running_job(db)
    op = start_op(db, coordinator(db, agent), job_id, "pause", repo.COPYING)
    agent.take(op.image_id)  # the agent took the copy; the coordinator died before hearing it
    fresh = coordinator(db, agent)
    assert run(settled(fresh, fresh.recover())) == 1
    assert db.run(lambda s: s.get(OperationRow, op.id)).state == repo.DONE
    assert db.run(lambda s: get_job(s, job_id)).state == js.PAUSED and claims(db, job_id) == []
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == op.image_id


def test_a_restarted_coordinator_rolls_back_a_copy_the_agent_never_took(db: Database, agent: ScriptedAgent) -> None:
    job_id, other = running_job(db), running_job(db)
    c = coordinator(db, agent)
    good = run(settled(c, c.checkpoint(job_id)))
    copying = start_op(db, c, job_id, "pause", repo.COPYING)
    requested = start_op(db, c, other, "checkpoint", repo.REQUESTED)
    db.run(lambda s: s.execute(update(OperationRow).where(OperationRow.id == copying.id)
                               .values(updated_at=repo.utcnow() - timedelta(minutes=5))))
    fresh = coordinator(db, agent)
    assert run(settled(fresh, fresh.recover())) == 2
    for op in (copying, requested):
        row = db.run(lambda s, op=op: s.get(OperationRow, op.id))
        assert row.state == repo.FAILED and "rolled back" in row.error
        assert db.run(lambda s, op=op: s.get(ImageRow, op.image_id)).state == repo.FAILED
    for job in (job_id, other):
        assert db.run(lambda s, job=job: get_job(s, job)).state == js.RUNNING and len(claims(db, job)) == 1
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == good.image_id


def test_a_write_that_fails_after_a_restart_keeps_the_last_good_image(db: Database, agent: ScriptedAgent) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    good = run(settled(c, c.checkpoint(job_id)))
    op = start_op(db, c, job_id, "pause", repo.COPYING)
    agent.images[op.image_id] = agent_pb2.AgentImageStatusResponse(image_state=1, step=20, ranks=2)
    run(c._adopt_copy(op))  # the copy was taken: the job is PAUSED, the write goes on
    assert db.run(lambda s: get_job(s, job_id)).state == js.PAUSED
    agent.images[op.image_id] = agent_pb2.AgentImageStatusResponse(image_state=3, error="disk full")
    fresh = coordinator(db, agent)
    run(settled(fresh, fresh.recover()))
    row = db.run(lambda s: s.get(OperationRow, op.id))
    assert row.state == repo.FAILED and "disk full" in row.error and good.image_id in row.error
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == good.image_id
    _, placed = run(settled(fresh, fresh.resume(job_id)))
    assert placed.state == js.PENDING  # resumes from the last good image


def test_retention_and_gc_free_what_no_kept_image_names_and_spare_a_write_in_flight(
    db: Database, agent: ScriptedAgent, tmp_path: Path
) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    ops = [run(settled(c, c.checkpoint(job_id))) for _ in range(5)]
    images = {op.image_id: agent.images[op.image_id] for op in ops}
    chunks = {i: set(chunk_digests(json.loads(s.manifest_json))) for i, s in images.items()}
    store = agent.store
    old = time.time() - 7200
    for chunk in store.chunks():
        os.utime(store.path(chunk.digest), (old, old))
    in_flight = os.urandom(1000)  # written by a checkpoint not yet recorded: recent
    store.put(digest_of(in_flight), in_flight)

    report = gc.collect(db, store, keep=3, grace=timedelta(minutes=10), finished_for=timedelta(hours=1))
    kept = [op.image_id for op in ops[2:]]
    assert report.images == 2
    remaining = {v.image.id for v in db.run(lambda s: repo.list_images(s, job_id))}
    assert remaining == set(kept)
    live = {ch.digest for ch in store.chunks()}
    needed = set().union(*(chunks[i] for i in kept))
    assert needed <= live
    assert not (chunks[ops[0].image_id] - needed) & live  # the deleted images' own chunks are gone
    assert digest_of(in_flight) in live
    assert report.chunks == len((chunks[ops[0].image_id] | chunks[ops[1].image_id]) - needed)
    manifest = json.loads(images[kept[-1]].manifest_json)
    materialize(store, manifest, tmp_path / "restore")  # the newest image is whole
    assert (tmp_path / "restore" / "READY").exists()


def test_an_agent_report_of_a_paused_exit_makes_the_job_paused_not_failed(db: Database) -> None:
    job_id = running_job(db)
    job = db.run(lambda s: get_job(s, job_id))
    report = heartbeats.JobReport(job_id, job.epoch, js.PAUSED, 0, "", {"step": 42})
    db.run(lambda s: heartbeats.heartbeat(s, job.node, [report], Events()))
    job = db.run(lambda s: get_job(s, job_id))
    assert job.state == js.PAUSED and "paused at step 42" in job.reason and claims(db, job_id) == []


def test_a_repeated_migrate_or_pause_with_one_request_id_is_one_operation_even_when_concurrent(
    db: Database, agent: ScriptedAgent
) -> None:
    """Idempotence by request id, on the real coordinator and database: a retried Migrate
    (sequential, or concurrent on two coordinators, as a client's retry reaching another
    replica) is answered with the first one's operation; the agent is asked once, one image
    is made, and the job is requeued once."""
    job_id = running_job(db)
    first, second = coordinator(db, agent), coordinator(db, agent)
    agent.delay_s = 0.05

    async def twice() -> list[Any]:
        both = await asyncio.gather(first.migrate(job_id, "mig-" + job_id, node="n-x"),
                                    second.migrate(job_id, "mig-" + job_id, node="n-x"))
        for c in (first, second):
            while c.tasks:
                await asyncio.gather(*list(c.tasks))
        return [op for op, _ in both]

    ops = run(twice())
    assert ops[0].id == ops[1].id and ops[0].state == repo.DONE, ops
    assert len(agent.calls) == 1 and agent.calls[0].pause
    again, placed = run(settled(first, first.migrate(job_id, "mig-" + job_id, node="n-x")))
    assert again.id == ops[0].id and again.state == repo.DONE and len(agent.calls) == 1
    assert placed.state == js.PENDING
    migrations = db.run(lambda s: s.scalars(select(OperationRow).where(OperationRow.job_id == job_id)).all())
    assert [(o.kind, o.request_id) for o in migrations] == [("migrate", "mig-" + job_id)]
    images = db.run(lambda s: s.scalars(select(ImageRow).where(ImageRow.job_id == job_id)).all())
    assert len(images) == 1 and images[0].id == ops[0].image_id
    job = db.run(lambda s: get_job(s, job_id))
    assert job.state == js.PENDING and [h for h in job.reason.split() if h == "resumed"] == ["resumed"]

    # A pause: the same, and a request id used once may not name another operation.
    other = running_job(db)

    async def paused_twice() -> list[Any]:
        both = await asyncio.gather(first.pause(other, "pause-" + other), second.pause(other, "pause-" + other))
        for c in (first, second):
            while c.tasks:
                await asyncio.gather(*list(c.tasks))
        return list(both)

    pauses = run(paused_twice())
    assert pauses[0].id == pauses[1].id and len(agent.calls) == 2
    assert db.run(lambda s: get_job(s, other)).state == js.PAUSED
    again = run(settled(first, first.pause(other, "pause-" + other)))
    assert again.id == pauses[0].id and again.state == repo.DONE and len(agent.calls) == 2
    with pytest.raises(AlreadyExists, match="was used for a pause"):
        run(first.migrate(other, "pause-" + other))
    with pytest.raises(AlreadyExists, match="was used for another job's operation") as refused:
        run(first.pause(other, "mig-" + job_id))  # of another job, maybe another tenant's: not named
    assert "migrate" not in str(refused.value) and f"of {job_id}" not in str(refused.value)
    assert len(agent.calls) == 2


async def until_written(c: Coordinator) -> None:
    while c.tasks:
        await asyncio.gather(*list(c.tasks))


def test_a_migration_resumes_its_job_at_the_copy_and_hands_the_start_the_image_being_written(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    good = run(settled(c, c.checkpoint(job_id)))

    async def scenario() -> OperationRow:
        agent.writing = True
        op, placed = await c.migrate(job_id, budget_s=0.5)
        # 1. Still being written, and the job is back in the queue already, not PAUSED.
        assert op.state == repo.WRITING and op.detail["streamed"] is True and placed.state == js.PENDING
        job = db.run(lambda s: get_job(s, job_id))
        assert "as it is written" in job.reason and op.image_id in job.reason
        # 2. A start now restores the image being written, streamed from the source's agent,
        #    with the last complete image to fall back on.
        fields = db.run(lambda s: read_models.launch_fields(s, job_id))
        assert fields["resume_image"] == op.image_id and fields["resume_fallback_image"] == good.image_id
        assert fields["resume_source"] == "127.0.0.1:1"  # the source node's registered agent address
        assert db.run(lambda s: read_models.resume_image(s, job_id)) == good.image_id  # complete images only
        node = "n-" + secrets.token_hex(4)  # the target
        db.run(lambda s: node_lifecycle.register(s, node, "127.0.0.1:2", [GpuRow(node=node, index=0, uuid=f"{node}-0",
                                                                            model="virtual", virtual=True)]))
        request = db.run(lambda s: SchedulingLoop._commit_start(s, Start(job_id, node, (0,)), Events()))
        assert (request.resume_image, request.resume_source) == (op.image_id, "127.0.0.1:1")
        # 2b. Lost there before the write ends (the target node died): requeued to restore the
        #     image being written, whatever its restart policy (never).
        def lost(s: Any) -> None:
            job = get_job(s, job_id, lock=True)
            lose(s, job, "node died", Events(), release_reason="node died")
        db.run(lost)
        job = db.run(lambda s: get_job(s, job_id))
        assert job.state == js.PENDING and f"restored from its last image {op.image_id}" in job.reason
        # 3. Written: the operation is done, and the image is the job's newest complete one.
        agent.writing = False
        await until_written(c)
        return op

    op = run(scenario())
    done = db.run(lambda s: s.get(OperationRow, op.id))
    assert done.state == repo.DONE and done.detail["image_id"] == op.image_id
    assert db.run(lambda s: repo.latest_image(s, job_id)).id == op.image_id
    fields = db.run(lambda s: read_models.launch_fields(s, job_id))
    assert fields["resume_image"] == op.image_id and "resume_source" not in fields


def test_a_streamed_migration_whose_write_fails_leaves_the_job_its_last_good_image(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    c = coordinator(db, agent)
    good = run(settled(c, c.checkpoint(job_id)))
    agent.write_error = "OSError: the store's disk is full"
    op, placed = run(settled(c, c.migrate(job_id)))
    assert op.state == repo.FAILED and "disk is full" in op.error and good.image_id in op.error
    assert placed.state == js.PENDING  # resumed at the copy: it goes on from the last good image
    assert db.run(lambda s: s.get(ImageRow, op.image_id)).state == repo.FAILED
    assert db.run(lambda s: read_models.launch_fields(s, job_id))["resume_image"] == good.image_id
    assert db.run(lambda s: read_models.streamed_image(s, job_id)) is None


def test_a_restarted_coordinator_resumes_a_migration_the_agent_had_copied_and_finishes_its_write(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    op = start_op(db, coordinator(db, agent), job_id, "migrate", repo.COPYING)
    agent.take(op.image_id)  # the agent took the copy; the coordinator was killed before hearing it
    fresh = coordinator(db, agent)
    assert run(settled(fresh, fresh.recover())) == 1
    done = db.run(lambda s: s.get(OperationRow, op.id))
    assert done.state == repo.DONE and done.detail["streamed"] is True
    job = db.run(lambda s: get_job(s, job_id))
    assert job.state == js.PENDING and claims(db, job_id) == []
    assert db.run(lambda s: read_models.resume_image(s, job_id)) == op.image_id


def test_with_streaming_off_a_migration_resumes_only_once_its_image_is_written(
    db: Database, agent: ScriptedAgent
) -> None:
    job_id = running_job(db)
    c = Coordinator(db, agent, CheckpointSettings(store_dir=agent.store.root, timeout_s=1.0, stream_migrations=False),
                    poll_s=0.01)

    async def scenario() -> None:
        agent.writing = True
        op, placed = await c.migrate(job_id, budget_s=0.5)
        assert op.state == repo.WRITING and placed.state == js.PAUSED and "streamed" not in op.detail
        assert db.run(lambda s: read_models.streamed_image(s, job_id)) is None
        agent.writing = False
        await until_written(c)

    run(scenario())
    assert db.run(lambda s: get_job(s, job_id)).state == js.PENDING
