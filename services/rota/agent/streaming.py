"""Node-to-node streaming of a migration's state, agent to agent, beside the durable write.

A migration of a one-node job resumes it on the target as soon as the source's ranks have
copied their state out (rota.checkpoint.coordinator). The image is then still being
written to the chunk store, so the target's agent takes the state from the source agent's
staged copy instead:

- source (`StagedSource`, behind AgentService.DescribeStaged and FetchStaged): lists the
  staged files of an image it is writing, with the pieces of each blob the store holds
  already (the write's progress, or chunks an earlier image put there), and serves byte
  ranges of those files as streams of 1 MiB messages, paced to ROTA_CHECKPOINT_STREAM_MBPS;
- target (`StagedStreams.fetch`): asks for the list, then fills the restore folder with
  several ranges in flight (ROTA_CHECKPOINT_STREAMS), reading the pieces the store holds
  from the store instead of the wire. The caller marks the folder READY once every byte
  is there (rota.agent.checkpoints).

The staged copy is never the only one: the durable write goes on whatever a target does,
and a target that loses its source (a killed agent, an ended write) tries again, or reads
the store once the image is complete there, or falls back to the job's last good image.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from rota import imageformat
from rota.common.tls import TLSFiles, open_channel
from rota.core.errors import InvalidArgument, NotFound
from rota.imagestore.chunks import ChunkStore
from rota.imagestore.pacing import RateCap
from rota.v1 import agent_pb2, agent_pb2_grpc, checkpoint_pb2

PIECE = 1 << 20  # bytes a FetchStaged message carries
RANGE = 8 << 20  # bytes one FetchStaged asks for: a blob is several ranges, in flight at once
DESCRIBE_TIMEOUT_S = 10.0
# An image record's state on the wire (AgentImageStatusResponse, DescribeStagedResponse).
IMAGE_STATES = {"writing": checkpoint_pb2.IMAGE_STATE_WRITING, "complete": checkpoint_pb2.IMAGE_STATE_COMPLETE,
                "failed": checkpoint_pb2.IMAGE_STATE_FAILED}
FETCH_TIMEOUT_S = 600.0  # one range; a paced stream of 8 MiB stays far inside it


class StagedGone(Exception):
    """The source holds no staged copy of the image (its write ended, or it never had one)."""


class StagedFailed(Exception):
    """The image's write failed at the source: it will never be complete."""


class SourceUnreachable(Exception):
    """No answer from the source agent (down, restarting, cut off): try again later."""


class StagedImage(Protocol):
    """What the source knows of an image it is writing (rota.agent.checkpoints.ImageRecord)."""

    image_id: str
    staging: str
    state: str
    error: str
    ranks: int
    step: int
    rank_ids: list[int]


@dataclass(frozen=True)
class StagedFileInfo:
    name: str
    rank: int
    path: Path


def staged_files(record: StagedImage) -> list[StagedFileInfo]:
    """The files of a staged copy: each rank's index and blob."""
    staging = Path(record.staging)
    out: list[StagedFileInfo] = []
    for rank in list(record.rank_ids) or range(record.ranks):
        for path in (imageformat.index_path(staging, rank), imageformat.blob_path(staging, rank)):
            out.append(StagedFileInfo(path.name, rank, path))
    return out


class ImageLookup(Protocol):
    def status(self, image_id: str) -> StagedImage | None: ...

    def stored_pieces(self, image_id: str) -> list[tuple[int, int, int, str]]: ...


class StagedSource:
    """The source agent's side: describes and serves the staged copies it is writing."""

    def __init__(self, images: ImageLookup, mbps: float = 0.0) -> None:
        self.images = images
        self.cap = RateCap(mbps)

    def _record(self, image_id: str) -> StagedImage:
        if not image_id:
            raise InvalidArgument("image_id", "required")
        record = self.images.status(image_id)
        if record is None:
            raise NotFound(f"no staged copy of image {image_id} here")
        return record

    def describe(self, image_id: str) -> agent_pb2.DescribeStagedResponse:
        record = self._record(image_id)
        reply = agent_pb2.DescribeStagedResponse(
            image_state=IMAGE_STATES.get(record.state, checkpoint_pb2.IMAGE_STATE_UNKNOWN), error=record.error,
            ranks=record.ranks, step=record.step)
        if record.state != "writing":
            return reply
        files = staged_files(record)
        try:
            reply.files.extend(agent_pb2.StagedFile(name=f.name, size=f.path.stat().st_size, rank=f.rank) for f in files)
        except FileNotFoundError as exc:  # the write ended meanwhile and dropped the staged copy
            raise NotFound(f"the staged copy of image {image_id} is gone (its write ended)") from exc
        blobs = {f.rank: f.name for f in files if f.name == imageformat.blob_path(Path(), f.rank).name}
        reply.stored.extend(agent_pb2.StoredPiece(name=blobs[rank], offset=offset, length=length, digest=digest)
                            for rank, offset, length, digest in self.images.stored_pieces(image_id) if rank in blobs)
        return reply

    async def fetch(self, request: agent_pb2.FetchStagedRequest) -> AsyncIterator[agent_pb2.FetchStagedResponse]:
        record = self._record(request.image_id)
        if record.state != "writing":
            raise NotFound(f"image {request.image_id} is {record.state} here: no staged copy to stream")
        found = next((f for f in staged_files(record) if f.name == request.name), None)
        if found is None:
            raise InvalidArgument("name", f"{request.name!r} is not a file of image {request.image_id}")
        try:
            fd = os.open(found.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NotFound(f"the staged copy of image {request.image_id} is gone (its write ended)") from exc
        try:
            size = os.fstat(fd).st_size
            if request.offset < 0 or request.length < 0 or request.offset + request.length > size:
                raise InvalidArgument("offset", f"range {request.offset}+{request.length} is outside the "
                                                f"{size} bytes of {request.name}")
            end = request.offset + request.length if request.length else size
            at = request.offset
            while at < end:
                n = min(PIECE, end - at)
                delay = self.cap.reserve(n, time.monotonic())
                if delay > 0:
                    await asyncio.sleep(delay)
                data = await asyncio.to_thread(os.pread, fd, n, at)
                if len(data) != n:
                    raise NotFound(f"{request.name} of image {request.image_id} ended early")
                yield agent_pb2.FetchStagedResponse(data=data, offset=at)
                at += n
        finally:
            os.close(fd)


@dataclass(frozen=True)
class StreamResult:
    wire_bytes: int  # bytes that came from the source agent
    store_bytes: int  # bytes read from pieces the store held already
    seconds: float


class StagedStreams:
    """The target agent's side: fills a restore folder from a source agent's staged copy."""

    def __init__(self, admin_token: str, tls: TLSFiles | None = None, streams: int = 4) -> None:
        self._metadata = (("authorization", f"Bearer {admin_token}"),)
        self._tls = tls
        self.streams = max(1, streams)
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def _stub(self, address: str) -> agent_pb2_grpc.AgentServiceStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(address, self._tls)
        return agent_pb2_grpc.AgentServiceStub(channel)

    def fetch(self, address: str, image_id: str, folder: Path, store: ChunkStore) -> StreamResult:
        """Every staged file of `image_id` into `folder` (not marked READY: the caller does).
        Raises StagedGone, StagedFailed or SourceUnreachable."""
        started = time.perf_counter()
        stub = self._stub(address)
        try:
            described = stub.DescribeStaged(agent_pb2.DescribeStagedRequest(image_id=image_id),
                                            timeout=DESCRIBE_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _failure(exc, address) from exc
        if described.image_state == checkpoint_pb2.IMAGE_STATE_FAILED:
            raise StagedFailed(described.error or "the image's write failed")
        if described.image_state != checkpoint_pb2.IMAGE_STATE_WRITING:
            raise StagedGone(f"image {image_id} is no longer being written at {address}")
        work = plan_pieces(described, store)
        folder.mkdir(parents=True, exist_ok=True)
        fds: dict[str, int] = {}
        try:
            for f in described.files:
                path = folder / Path(f.name).name  # a name, never a path the source picked
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                fds[f.name] = fd
                os.ftruncate(fd, f.size)
            with ThreadPoolExecutor(max_workers=self.streams, thread_name_prefix="stream-in") as pool:
                done = list(pool.map(lambda piece: self._piece(stub, image_id, piece, fds[piece.name], store), work))
        except grpc.RpcError as exc:
            raise _failure(exc, address) from exc
        finally:
            for fd in fds.values():
                os.close(fd)
        wire = sum(n for n, via in done if via == "wire")
        return StreamResult(wire, sum(n for n, via in done if via == "store"), time.perf_counter() - started)

    def _piece(self, stub: agent_pb2_grpc.AgentServiceStub, image_id: str, piece: Piece, fd: int,
               store: ChunkStore) -> tuple[int, str]:
        if piece.digest:
            data = bytearray(piece.length)
            store.read_into(piece.digest, memoryview(data))
            os.pwrite(fd, data, piece.offset)
            return piece.length, "store"
        got = 0
        request = agent_pb2.FetchStagedRequest(image_id=image_id, name=piece.name, offset=piece.offset,
                                               length=piece.length)
        for message in stub.FetchStaged(request, timeout=FETCH_TIMEOUT_S, metadata=self._metadata):
            os.pwrite(fd, message.data, message.offset)
            got += len(message.data)
        if got != piece.length:
            raise StagedGone(f"{piece.name} of image {image_id}: {got} of {piece.length} bytes came")
        return got, "wire"

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


@dataclass(frozen=True)
class Piece:
    name: str
    offset: int
    length: int
    digest: str = ""  # set: read it from the store under this digest; empty: from the wire


def plan_pieces(described: agent_pb2.DescribeStagedResponse, store: ChunkStore) -> list[Piece]:
    """Every byte of every file once: the pieces the store holds from there, the gaps
    between them from the wire in ranges of at most RANGE (largest first, so the last
    ranges in flight are short)."""
    held: dict[str, list[Piece]] = {}
    for p in described.stored:
        if p.length > 0 and store.has(p.digest):
            held.setdefault(p.name, []).append(Piece(p.name, p.offset, p.length, p.digest))
    out: list[Piece] = []
    for f in described.files:
        at = 0
        for piece in sorted(held.get(f.name, []), key=lambda q: q.offset):
            if piece.offset < at or piece.offset + piece.length > f.size:
                continue  # overlapping or outside the file: take those bytes from the wire
            out.extend(_ranges(f.name, at, piece.offset))
            out.append(piece)
            at = piece.offset + piece.length
        out.extend(_ranges(f.name, at, f.size))
    return sorted(out, key=lambda p: (bool(p.digest), -p.length))


def _ranges(name: str, start: int, end: int) -> list[Piece]:
    return [Piece(name, o, min(RANGE, end - o)) for o in range(start, end, RANGE)]


def _failure(exc: grpc.RpcError, address: str) -> Exception:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.NOT_FOUND:
        return StagedGone(details or "no staged copy")
    return SourceUnreachable(f"{address}: {code.name if code else 'error'}: {details}")
