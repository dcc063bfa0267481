"""The cluster state as wire messages: a job (with its history), a job as one node's agent
is told it, a node with its GPUs and claims."""

from __future__ import annotations

from collections.abc import Sequence

from rota.cluster.models import GpuClaimRow, GpuRow, JobRow, JobTransitionRow, NodeRow
from rota.common.convert import health_value, spec_to_proto, state_value, struct, timestamp
from rota.core.jobspec import JobSpecData
from rota.v1 import common_pb2


def job_to_proto(job: JobRow, transitions: Sequence[JobTransitionRow] = ()) -> common_pb2.Job:
    message = common_pb2.Job(
        id=job.id,
        spec=spec_to_proto(JobSpecData.from_dict(job.spec)),
        state=state_value(job.state),
        node=job.node or "",
        gpus=list(job.gpu_indices),
        epoch=job.epoch,
        progress=struct(job.progress or {}),
        exit_code=job.exit_code or 0,
        error=job.error,
        attempts=job.attempts,
        reason=job.reason,
        history=[
            common_pb2.StateChange(
                from_state=state_value(t.from_state),
                to_state=state_value(t.to_state),
                reason=t.reason,
                at=timestamp(t.at),
            )
            for t in transitions
        ],
    )
    if job.replicas:  # a realtime app: each node's replicas, home first
        message.replicas.extend(
            common_pb2.NodeReplicas(node=n, gpus=list(job.replicas[n]["gpus"]), epoch=int(job.replicas[n]["epoch"]))
            for n in sorted(job.replicas, key=lambda n: (n != job.node, n)))
    if job.array_id:
        message.array_id, message.array_index = job.array_id, job.array_index or 0
    if job.guest_of:
        message.guest_of = job.guest_of
    if job.gang_nodes:
        host, _, port = job.gang_master.rpartition(":")
        message.gang.CopyFrom(common_pb2.Gang(
            nodes=list(job.gang_nodes), master_addr=host, master_port=int(port or 0),
            ranks_per_node=len(job.gpu_indices)))
    for name in ("created_at", "started_at", "finished_at"):
        value = timestamp(getattr(job, name))
        if value is not None:
            getattr(message, name).CopyFrom(value)
    return message


def job_on_node(job: JobRow, node: str) -> common_pb2.Job:
    """The job as `node`'s agent runs it: a realtime app with only that node's replicas
    (its GPUs there, under that node's epoch); any other job as it is."""
    message = job_to_proto(job)
    lease = (job.replicas or {}).get(node)
    if lease is not None:
        message.node, message.epoch = node, int(lease["epoch"])
        message.ClearField("gpus")
        message.gpus.extend(int(g) for g in lease["gpus"])
        mine = [r for r in message.replicas if r.node == node]
        message.ClearField("replicas")
        message.replicas.extend(mine)
    return message


def node_to_proto(node: NodeRow, gpus: Sequence[GpuRow], claims: Sequence[GpuClaimRow]) -> common_pb2.Node:
    holder = {claim.gpu_index: claim.job_id for claim in claims}
    return common_pb2.Node(
        name=node.name,
        address=node.address,
        health=health_value(node.health),
        last_heartbeat=timestamp(node.last_heartbeat),
        gpus=[
            common_pb2.Gpu(index=g.index, uuid=g.uuid, model=g.model, virtual=g.virtual, job_id=holder.get(g.index, ""),
                           type=g.gpu_type)
            for g in sorted(gpus, key=lambda g: g.index)
        ],
        labels=dict(node.labels or {}),
        cpus=node.cpus, memory_bytes=node.memory_bytes,
    )
