"""Checkpoints in the SDK: pause, resume, migrate, checkpoint, and a job's images.

The api forwards `rota.v1.CheckpointService`, so these calls ride the client's channel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from rota.client._wire import enum_name, job_state
from rota.client.enums import JobState
from rota.v1 import checkpoint_pb2, checkpoint_pb2_grpc

# Past the ranks' own timeout, a pause waits for the ranks to exit and the api forwards:
# the RPC deadline leaves room for both.
RPC_MARGIN_S = 60.0


def stub(channel: grpc.Channel) -> checkpoint_pb2_grpc.CheckpointServiceStub:
    return checkpoint_pb2_grpc.CheckpointServiceStub(channel)


def _when(unix: float) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix > 0 else None


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


@dataclass(frozen=True)
class CheckpointResult:
    image_id: str
    step: int
    ranks: int
    logical_bytes: int
    bytes_written: int  # new bytes in the chunk store
    copy_seconds: float
    write_seconds: float

    @staticmethod
    def _from_proto(r: checkpoint_pb2.CheckpointResponse) -> CheckpointResult:
        return CheckpointResult(r.image_id, r.step, r.ranks, r.logical_bytes, r.bytes_written, r.copy_seconds,
                                r.write_seconds)


@dataclass(frozen=True)
class PauseResult:
    image_id: str
    step: int
    pause_seconds: float  # request to GPUs released
    node: str
    ranks: int

    @staticmethod
    def _from_proto(r: checkpoint_pb2.PauseResponse) -> PauseResult:
        return PauseResult(r.image_id, r.step, r.pause_seconds, r.node, r.ranks)


@dataclass(frozen=True)
class ResumeResult:
    state: JobState
    node: str  # "" while not placed yet
    gpus: list[int]
    image_id: str  # "" when the job had no image: it starts over
    step: int

    @staticmethod
    def _from_proto(r: checkpoint_pb2.ResumeResponse) -> ResumeResult:
        state = job_state(r.job_state)
        return ResumeResult(state, r.node, list(r.gpus), r.image_id, r.step)


@dataclass(frozen=True)
class MigrateResult:
    image_id: str
    step: int
    from_node: str
    node: str
    gpus: list[int]
    pause_seconds: float
    migrate_seconds: float  # request to placed again (0 when not waited for)

    @staticmethod
    def _from_proto(r: checkpoint_pb2.MigrateResponse) -> MigrateResult:
        return MigrateResult(r.image_id, r.step, r.from_node, r.node, list(r.gpus), r.pause_seconds, r.migrate_seconds)


@dataclass(frozen=True)
class CheckpointImage:
    id: str
    sequence: int
    kind: str  # checkpoint | periodic | pause
    state: str  # writing | complete | failed
    node: str
    ranks: int
    step: int
    logical_bytes: int  # the state of all ranks
    stored_bytes: int  # what this image added to the store
    unique_bytes: int  # its distinct chunks
    chunks: int
    copy_seconds: float
    write_seconds: float
    created_at: datetime | None
    error: str

    @property
    def dedup_ratio(self) -> float | None:
        """Logical bytes per byte this image added to the store (None when it added none)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "created_at": _iso(self.created_at), "dedup_ratio": self.dedup_ratio}

    @staticmethod
    def _from_proto(i: checkpoint_pb2.CheckpointImage) -> CheckpointImage:
        kind = enum_name(checkpoint_pb2.ImageKind, i.image_kind, "IMAGE_KIND_", lower=True)
        state = enum_name(checkpoint_pb2.ImageState, i.image_state, "IMAGE_STATE_", lower=True)
        return CheckpointImage(
            i.id, i.sequence, kind, state, i.node, i.ranks, i.step, i.logical_bytes, i.stored_bytes,
            i.unique_bytes, i.chunks, i.copy_seconds, i.write_seconds, _when(i.created_unix), i.error,
        )


@dataclass(frozen=True)
class CheckpointOperation:
    id: int
    operation_id: str
    kind: str
    state: str
    target_node: str
    image_id: str
    error: str
    created_at: datetime | None
    finished_at: datetime | None
    streamed: bool = False  # a migration that resumed its job at the copy, its state streamed node to node
    source_node: str = ""  # where the copy was taken ("" for a resume)
    pause_seconds: float = 0.0  # request to the ranks gone
    write_seconds: float = 0.0  # the image's background write

    @property
    def seconds(self) -> float | None:
        """Request to end, once ended."""
        if self.created_at is None or self.finished_at is None:
            return None
        return max(0.0, (self.finished_at - self.created_at).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "created_at": _iso(self.created_at), "finished_at": _iso(self.finished_at),
                "seconds": self.seconds}

    @staticmethod
    def _from_proto(o: checkpoint_pb2.CheckpointOperation) -> CheckpointOperation:
        kind = enum_name(checkpoint_pb2.OperationKind, o.operation_kind, "OPERATION_KIND_", lower=True)
        state = enum_name(checkpoint_pb2.OperationState, o.operation_state, "OPERATION_STATE_", lower=True)
        return CheckpointOperation(o.id, o.operation_id, kind, state, o.target_node, o.image_id, o.error,
                                   _when(o.created_unix), _when(o.finished_unix), o.streamed, o.source_node,
                                   o.pause_seconds, o.write_seconds)


@dataclass(frozen=True)
class JobImages:
    job_id: str
    images: list[CheckpointImage]
    operations: list[CheckpointOperation]

    @property
    def logical_bytes(self) -> int:
        return sum(i.logical_bytes for i in self.images if i.state == "complete")

    @property
    def stored_bytes(self) -> int:
        return sum(i.stored_bytes for i in self.images if i.state == "complete")

    @property
    def dedup_ratio(self) -> float | None:
        """All complete images' logical bytes per byte they added to the store."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "images": [i.to_dict() for i in self.images],
            "operations": [o.to_dict() for o in self.operations], "logical_bytes": self.logical_bytes,
            "stored_bytes": self.stored_bytes, "dedup_ratio": self.dedup_ratio,
        }

    @staticmethod
    def _from_proto(job_id: str, r: checkpoint_pb2.ListImagesResponse) -> JobImages:
        return JobImages(job_id, [CheckpointImage._from_proto(i) for i in r.images],
                         [CheckpointOperation._from_proto(o) for o in r.operations])
