"""Node-to-node streaming of a staged copy between two real agents' checkpoint managers, the
source's AgentService on a real gRPC port: byte-for-byte, skipping what the store holds,
falling back to the last good image when the write fails, waiting out a source that is down,
reading the store once the write ended, and refusing what it must."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from rota import imageformat
from rota.agent.checkpoints import FAILED, RESTORE_REQUEST, AgentCheckpoints, ImageRecord
from rota.agent.processes import LocalJob, ProcessTable
from rota.agent.streaming import StagedStreams
from rota.bench.agent_server import AgentServer
from rota.imagestore.images import write_staged
from rota.imagestore.settings import CheckpointSettings
from rota.jobfiles import control
from rota.operator.localcluster import free_port
from rota.v1 import agent_pb2, agent_pb2_grpc

TOKEN = "admin-" + secrets.token_hex(8)
META = (("authorization", f"Bearer {TOKEN}"),)
CHUNK = 256 * 1024


def make_checkpoints(root: Path, node: str, streams: StagedStreams | None = None) -> AgentCheckpoints:
    home = root / node
    home.mkdir(parents=True, exist_ok=True)
    # Each node its own staging root (and handoff folder): only streaming joins them.
    settings = CheckpointSettings(store_dir=root / "chunks", chunk_size=CHUNK, fsync=False,
                                  staging_root=root / f"shm-{node}" / node)
    return AgentCheckpoints(node, ProcessTable(node, home, home / "lease", 60), home, settings, streams)


def source_agent(checkpoints: AgentCheckpoints, port: int = 0) -> AgentServer:
    """Node a's AgentService, as `rota agent` serves it (admin token only)."""
    return AgentServer(checkpoints, TOKEN, port)


@dataclass
class Pair:
    root: Path
    source: AgentCheckpoints
    target: AgentCheckpoints
    agent: AgentServer

    def stage(self, image_id: str, step: int, numel: int = 600_000) -> tuple[ImageRecord, dict[int, torch.Tensor]]:
        """A two-rank staged copy on node a, its write not started (as right after a pause)."""
        folder = self.source.staging_of("job-1", 1) / image_id
        models = {}
        for rank in range(2):
            gen = torch.Generator().manual_seed(step * 10 + rank)
            models[rank] = torch.randn(numel, generator=gen)
            imageformat.stage(folder, rank, 2, step, {"object:model": models[rank], "rng": torch.full((4,), float(rank))})
        record = ImageRecord(image_id=image_id, job_id="job-1", staging=str(folder), ranks=2, step=step, pause=True,
                             logical_bytes=0, copy_s=0.0, pause_s=0.0)
        self.source._save(record)
        return record, models

    def restore(self, image_id: str, *, wait_s: float = 20, fallback: str = "", source: str = "") -> Path:
        folder = self.root / "restored" / secrets.token_hex(4)
        self.target._materialize(folder, image_id, wait_s, source or self.agent.address, fallback)
        return folder


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    source = make_checkpoints(tmp_path, "a")
    target = make_checkpoints(tmp_path, "b", StagedStreams(TOKEN, streams=3))
    agent = source_agent(source)
    try:
        yield Pair(tmp_path, source, target, agent)
    finally:
        agent.stop()
        source.close()
        target.close()


def loaded(folder: Path, rank: int) -> torch.Tensor:
    assert (folder / control.READY).exists(), (folder / control.FAILED).read_text() if (folder / control.FAILED).exists() else ""
    _, state = imageformat.load(folder, rank)
    return state["object:model"]


def test_a_target_streams_the_staged_copy_byte_for_byte_while_the_write_has_not_begun(pair: Pair) -> None:
    record, models = pair.stage("img-1", step=30)
    folder = pair.restore("img-1")
    for rank in range(2):
        assert imageformat.blob_path(folder, rank).read_bytes() == imageformat.blob_path(Path(record.staging), rank).read_bytes()
        assert torch.equal(loaded(folder, rank), models[rank])
        assert imageformat.read_index(folder, rank)["step"] == 30
    assert "sources" not in imageformat.read_index(folder, 0)  # streamed, not the store's chunk files
    with pytest.raises(FileNotFoundError):
        pair.source.store.get_manifest("img-1")  # nothing of it was written: it all came over the wire


def test_pieces_the_store_holds_come_from_the_store_and_the_rest_over_the_wire(pair: Pair) -> None:
    record, _ = pair.stage("img-2", step=40)
    # Half the write done: rank 0's pieces are in the store, and the source says so.
    write_staged(pair.source.store, Path(record.staging), [0], CHUNK,
                 on_stored=lambda r, o, n, d: pair.source._stored.setdefault("img-2", []).append((r, o, n, d)))
    streams = StagedStreams(TOKEN, streams=2)
    folder = pair.root / "skip"
    result = streams.fetch(pair.agent.address, "img-2", folder, pair.target.store)
    streams.close()
    blob0 = imageformat.blob_path(Path(record.staging), 0).stat().st_size
    blob1 = imageformat.blob_path(Path(record.staging), 1).stat().st_size
    assert 0.9 * blob0 < result.store_bytes <= blob0
    assert result.wire_bytes + result.store_bytes == sum(p.stat().st_size for p in Path(record.staging).iterdir())
    assert result.wire_bytes >= blob1
    for rank in range(2):
        assert imageformat.blob_path(folder, rank).read_bytes() == imageformat.blob_path(Path(record.staging), rank).read_bytes()


def test_a_failed_write_makes_a_waiting_target_restore_the_last_good_image(pair: Pair) -> None:
    old, old_models = pair.stage("img-old", step=10)
    pair.source._write(old)  # complete in the store
    record, _ = pair.stage("img-new", step=20)
    pair.source._finish(record, FAILED, error="OSError: the store's disk is full")
    folder = pair.restore("img-new", fallback="img-old")
    assert imageformat.read_index(folder, 0)["step"] == 10
    assert torch.equal(loaded(folder, 1), old_models[1])


def test_a_failed_write_without_an_earlier_image_fails_the_restore_with_the_reason(pair: Pair) -> None:
    record, _ = pair.stage("img-only", step=20)
    pair.source._finish(record, FAILED, error="OSError: the store's disk is full")
    folder = pair.restore("img-only")
    why = (folder / control.FAILED).read_text()
    assert "disk is full" in why and "no earlier image" in why


def test_a_target_waits_out_a_source_that_is_down_and_streams_once_it_is_back(tmp_path: Path) -> None:
    source = make_checkpoints(tmp_path, "a")
    target = make_checkpoints(tmp_path, "b", StagedStreams(TOKEN))
    port = free_port()
    pair = Pair(tmp_path, source, target, agent=None)  # type: ignore[arg-type]
    _, models = pair.stage("img-3", step=50)
    folder = tmp_path / "waited"
    waiting = threading.Thread(target=target._materialize, args=(folder, "img-3", 30, f"127.0.0.1:{port}", ""))
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive() and not (folder / control.READY).exists()  # nothing answers at that address yet
    agent = source_agent(source, port)  # the source agent is back (a restarted agent adopts its records)
    try:
        waiting.join(30)
        assert not waiting.is_alive()
        assert torch.equal(loaded(folder, 0), models[0])
    finally:
        agent.stop()
        source.close()
        target.close()


def test_a_write_that_ended_sends_the_target_to_the_store(pair: Pair) -> None:
    record, models = pair.stage("img-4", step=60)
    pair.source._write(record)  # written and the staged copy dropped before the target asked
    assert not Path(record.staging).exists()
    folder = pair.restore("img-4")
    assert "sources" in imageformat.read_index(folder, 0)  # mapped from the store's chunk files
    assert torch.equal(loaded(folder, 1), models[1])


def test_a_restarted_agent_takes_up_the_restore_an_adopted_job_still_waits_for(pair: Pair) -> None:
    _, models = pair.stage("img-5", step=70)
    folder = pair.target.restore_dir("job-9", 3)
    folder.mkdir(parents=True)
    # The agent that began this restore was killed before it finished: its request file is left.
    control.write_atomic(folder / RESTORE_REQUEST, json.dumps(
        {"image_id": "img-5", "wait_s": 20, "source": pair.agent.address, "fallback": "", "until": time.time() + 20}))
    restarted = make_checkpoints(pair.root, "b", StagedStreams(TOKEN))
    try:
        # The job process it adopted (this test's own process group: alive) waits for READY.
        restarted.table.jobs["job-9"] = LocalJob("job-9", 3, [0], os.getpgid(0), pair.root / "job-9-3")
        assert restarted.resume_restores() == 1
        deadline = time.monotonic() + 20
        while not (folder / control.READY).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert torch.equal(loaded(folder, 0), models[0])
        assert restarted.resume_restores() == 0  # READY: nothing left to take up
    finally:
        restarted.close()


def field_of(error: Any) -> str:
    """The field an INVALID_ARGUMENT names (the rota-field trailer)."""
    return str(dict(error.trailing_metadata()).get("rota-field", ""))


def test_fetch_refuses_other_files_ranges_outside_and_callers_without_the_admin_token(pair: Pair) -> None:
    pair.stage("img-6", step=80)
    with grpc.insecure_channel(pair.agent.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)

        def fetch(metadata: tuple[tuple[str, str], ...] = META, **fields: object) -> grpc.RpcError:
            request = agent_pb2.FetchStagedRequest(image_id="img-6", **fields)  # type: ignore[arg-type]
            with pytest.raises(grpc.RpcError) as raised:
                list(stub.FetchStaged(request, timeout=10, metadata=metadata))
            return raised.value

        outside = fetch(name="../../a/lease")
        assert outside.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert field_of(outside) == "name"
        too_far = fetch(name="rank-0.json", offset=1 << 40)
        assert field_of(too_far) == "offset"
        assert fetch(metadata=(), name="rank-0.bin").code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as unknown:
            stub.DescribeStaged(agent_pb2.DescribeStagedRequest(image_id="img-none"), timeout=10, metadata=META)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        described = stub.DescribeStaged(agent_pb2.DescribeStagedRequest(image_id="img-6"), timeout=10, metadata=META)
        assert sorted(f.name for f in described.files) == ["rank-0.bin", "rank-0.json", "rank-1.bin", "rank-1.json"]
