"""Health in the SDK: the failure detector's verdicts, re-plans (shown or applied), draining
nodes, and devices out of the plan.

The api forwards `rota.v1.DetectorService`'s unary RPCs, so these calls ride the
client's channel (heartbeat streams go to the detector directly, from agents).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from rota.client._wire import enum_name
from rota.v1 import common_pb2, detector_pb2, detector_pb2_grpc


def stub(channel: grpc.Channel) -> detector_pb2_grpc.DetectorServiceStub:
    return detector_pb2_grpc.DetectorServiceStub(channel)


@dataclass(frozen=True)
class Verdict:
    """A rank (-1: the whole job) judged `slow` (ratio = observed / expected time) or `stop`
    (ratio = silence / timeout) at an iteration, where it ran, and why (`evidence`)."""

    job_id: str
    rank: int
    kind: str
    iteration: int
    ratio: float
    node: str
    gpu: int | None
    epoch: int
    at: datetime | None
    evidence: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def _from_proto(v: detector_pb2.Verdict) -> Verdict:
        try:
            evidence = json.loads(v.evidence) if v.evidence else {}
        except ValueError:
            evidence = {"text": v.evidence}
        kind = enum_name(detector_pb2.VerdictKind, v.verdict_kind, "VERDICT_KIND_", lower=True)
        return Verdict(
            job_id=v.job_id, rank=v.rank, kind=kind, iteration=v.iteration, ratio=v.ratio, node=v.node,
            gpu=v.gpu if v.gpu >= 0 else None, epoch=v.epoch,
            at=datetime.fromtimestamp(v.at_unix, UTC) if v.at_unix else None, evidence=evidence,
        )

    @property
    def device(self) -> str:
        return f"{self.node}/{self.gpu}" if self.node and self.gpu is not None else (self.node or "-")

    def summary(self) -> str:
        """One line for people: who, what, how much, where."""
        e = self.evidence
        who = "the job" if self.rank < 0 else f"rank {self.rank}"
        if "stage" in e:
            who += f" (stage {e['stage']}, replica {e['replica']})"
        if self.kind == "stop":
            what = f"stop: silent {e.get('silent_s', 0):.1f}s (timeout {e.get('timeout_s', 0):g}s)"
        else:
            what = f"slow: {self.ratio:.2f}x its expected time"
        when = f"iteration {self.iteration}" if self.iteration >= 0 else "before any iteration"
        return f"{when}: {who} {what} on {self.device} (epoch {self.epoch})"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["at"] = self.at.isoformat() if self.at else None
        return out


@dataclass(frozen=True)
class DrainResult:
    node: str
    health: str
    running_jobs: int

    @staticmethod
    def _from_proto(r: detector_pb2.DrainResponse) -> DrainResult:
        health = enum_name(common_pb2.NodeHealth, r.node_health, "NODE_HEALTH_")
        return DrainResult(r.node, health, r.running_jobs)


@dataclass(frozen=True)
class DeviceHealth:
    """A GPU out of the plan (`BAD`) since a verdict on the rank that ran there, or put back
    (`CLEARED`) by an operator. `job_id` is empty for another tenant's job."""

    node: str
    gpu: int
    state: str
    reason: str
    job_id: str
    rank: int | None
    kind: str
    since: datetime | None
    cleared: datetime | None

    @property
    def device(self) -> str:
        return f"{self.node}:{self.gpu}"

    @staticmethod
    def _from_proto(d: detector_pb2.DeviceHealth) -> DeviceHealth:
        return DeviceHealth(
            node=d.node, gpu=d.gpu, state=enum_name(detector_pb2.DeviceState, d.device_state, "DEVICE_STATE_"),
            reason=d.reason, job_id=d.job_id, rank=d.rank if d.rank >= 0 else None,
            kind=enum_name(detector_pb2.VerdictKind, d.verdict_kind, "VERDICT_KIND_", lower=True),
            since=datetime.fromtimestamp(d.since_unix, UTC) if d.since_unix else None,
            cleared=datetime.fromtimestamp(d.cleared_unix, UTC) if d.cleared_unix else None,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["since"] = self.since.isoformat() if self.since else None
        out["cleared"] = self.cleared.isoformat() if self.cleared else None
        return out


@dataclass(frozen=True)
class ReplanResult:
    """Throughputs relative to the healthy layout (1.0): as is, re-planned, and dropping the
    affected data-parallel replicas. `stages`: (replica, stage, ranks, layers, speed).

    Applied (`applied`): the job was checkpointed at `step` into `image_id` on `from_node`
    and restarts with `applied_layout` (what it reads from ROTA_LAYOUT), on `node` once placed.
    """

    layout: dict[str, int]
    device_speeds: list[float]
    stages: list[dict[str, Any]]
    layers_per_stage: list[int]
    microbatches_per_replica: list[int]
    idle_ranks: list[int]
    throughput_before: float
    throughput_after: float
    throughput_drop_group: float
    applied: bool = False
    applied_layout: dict[str, Any] | None = None
    image_id: str = ""
    step: int = 0
    from_node: str = ""
    node: str = ""

    @staticmethod
    def _from_proto(r: detector_pb2.ReplanResponse) -> ReplanResult:
        return ReplanResult(
            layout={"tp": r.layout.tp, "pp": r.layout.pp, "dp": r.layout.dp}, device_speeds=list(r.device_speeds),
            stages=[{"replica": s.replica, "stage": s.stage, "ranks": list(s.ranks), "layers": s.layers, "speed": s.speed}
                    for s in r.stages],
            layers_per_stage=list(r.layers_per_stage), microbatches_per_replica=list(r.microbatches_per_replica),
            idle_ranks=list(r.idle_ranks), throughput_before=r.throughput_before, throughput_after=r.throughput_after,
            throughput_drop_group=r.throughput_drop_group, applied=r.applied,
            applied_layout=_applied_layout(r), image_id=r.image_id,
            step=r.step, from_node=r.from_node, node=r.node,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _applied_layout(r: detector_pb2.ReplanResponse) -> dict[str, Any] | None:
    """What the job reads from ROTA_LAYOUT (its replanned_layout); None when none was applied."""
    if r.HasField("replanned_layout"):
        m = r.replanned_layout
        return {
            "tp": m.tp, "pp": m.pp, "dp": m.dp,
            "stages": [{"replica": s.replica, "stage": s.stage, "ranks": list(s.ranks), "layers": s.layers,
                        "speed": s.speed} for s in m.stages],
            "layers_per_stage": list(m.layers_per_stage), "microbatches_per_replica": list(m.microbatches_per_replica),
            "idle_ranks": list(m.idle_ranks), "throughput_before": m.throughput_before,
            "throughput_after": m.throughput_after, "throughput_drop_group": m.throughput_drop_group,
            "layers": m.layers, "microbatches": m.microbatches, "device_speeds": list(m.device_speeds),
            "from_epoch": m.from_epoch,
        }
    return None


def replan_request(
    *, job_id: str, tp: int, pp: int, dp: int, speeds: Sequence[float], layers: int, microbatches: int,
    apply: bool = False, wait_s: float = 0.0, operation_id: str = "",
) -> detector_pb2.ReplanRequest:
    request = detector_pb2.ReplanRequest(job_id=job_id, device_speeds=list(speeds), layers=layers, microbatches=microbatches,
                                         apply=apply, wait_seconds=wait_s, operation_id=operation_id)
    if tp or pp or dp:
        request.layout.CopyFrom(detector_pb2.Layout(tp=tp, pp=pp, dp=dp))
    return request
