"""The read models services publish for each other: views, declared here, read only here.

A service owns its tables and is their only writer (docs/architecture.md). Where another
service must read some of that data inside its own transaction (the allocator commits a
start with the image to resume from; the api answers a heartbeat with it), it reads a view
the owner publishes (migrations/versions/0010_read_models.py, 0012_ledger_gpu_rates.py,
0016_streamed_resume_images.py, 0017_cluster_read_models.py)
instead of the owner's tables or code. The view's columns are the contract; the owner may
reshape its tables behind it.

| view                        | owner      | readers             |
|-----------------------------|------------|---------------------|
| checkpoint_resume_images    | checkpoint | allocator, api, detector |
| checkpoint_streamed_images  | checkpoint | allocator, api      |
| checkpoint_move_costs       | checkpoint | allocator           |
| checkpoint_resume_targets   | checkpoint | allocator           |
| detector_bad_gpus           | detector   | allocator           |
| detector_applied_layouts    | detector   | allocator, api      |
| node_gpu_types              | rota.cluster | ledger |
| cluster_jobs                | rota.cluster | ledger, forecaster |
| cluster_job_leases          | rota.cluster | ledger |
| cluster_requeues            | rota.cluster | ledger |
| cluster_pause_moves         | rota.cluster | ledger |
| cluster_alive_gpus          | rota.cluster | ledger |

The cluster's views (migrations/versions/0017_cluster_read_models.py) are declared here
and read by the ledger's and the forecaster's own query code.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    column,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from rota.common.layouts import layout_fields, layout_json
from rota.core import jobstate

# Views, not tables: on their own metadata so that migrations never try to create them.
VIEWS = MetaData()

resume_images = Table(
    "checkpoint_resume_images", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("image_id", String(40)), Column("sequence", Integer),
    Column("write_s", Float), Column("copy_s", Float), Column("logical_bytes", BigInteger),
)
# The cluster's columns the views below are joined with (rota.cluster owns those tables;
# this module reads these columns only, and imports none of its models).
_nodes = table("nodes", column("name"), column("address"))
_jobs = table("jobs", column("id"), column("state"))

streamed_images = Table(
    "checkpoint_streamed_images", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("image_id", String(40)), Column("source_node", String(64)),
)
move_costs = Table(
    "checkpoint_move_costs", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("write_s", Float), Column("copy_s", Float),
    Column("logical_bytes", BigInteger), Column("recent_pauses_s", ARRAY(Float)),
)
resume_targets = Table(
    "checkpoint_resume_targets", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("target_node", String(64)),
)
bad_gpu_rows = Table(
    "detector_bad_gpus", VIEWS,
    Column("node", String(64), primary_key=True), Column("gpu_index", Integer, primary_key=True),
)
applied_layouts = Table(
    "detector_applied_layouts", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("layout", JSONB), Column("from_epoch", BigInteger),
)
node_gpu_types = Table(
    "node_gpu_types", VIEWS,
    Column("node", String(64), primary_key=True), Column("gpu_index", Integer, primary_key=True),
    Column("gpu_type", String(32)),
)
# rota.cluster's: every job (its times, size, spec and reported progress) ...
cluster_jobs = Table(
    "cluster_jobs", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("tenant", String(64)), Column("name", String(128)),
    Column("kind", String(32)), Column("state", String(16)), Column("reason", Text), Column("priority", Integer),
    Column("gpus", Integer), Column("spec", JSONB), Column("progress", JSONB),
    Column("created_at", DateTime(timezone=True)), Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)), Column("array_id", String(32)), Column("array_capped", Boolean),
    Column("submitted_by", String(64)),  # the user whose token submitted it (0019); NULL: none
)
# ... every lease of GPUs (a placement) with its job's tenant ...
cluster_job_leases = Table(
    "cluster_job_leases", VIEWS,
    Column("placement_id", BigInteger, primary_key=True), Column("job_id", String(32)), Column("tenant", String(64)),
    Column("node", String(64)), Column("gang_nodes", ARRAY(String(64))), Column("gpu_indices", ARRAY(Integer)),
    Column("guest_of", String(32)), Column("created_at", DateTime(timezone=True)),
    Column("promoted_at", DateTime(timezone=True)), Column("released_at", DateTime(timezone=True)),
)
# ... when each requeued job last went back to PENDING ...
cluster_requeues = Table(
    "cluster_requeues", VIEWS,
    Column("job_id", String(32), primary_key=True), Column("requeued_at", DateTime(timezone=True)),
)
# ... each job's moves into and out of PAUSED ...
cluster_pause_moves = Table(
    "cluster_pause_moves", VIEWS,
    Column("transition_id", BigInteger, primary_key=True), Column("job_id", String(32)),
    Column("from_state", String(16)), Column("to_state", String(16)), Column("at", DateTime(timezone=True)),
)
# ... and the GPUs of the nodes alive now.
cluster_alive_gpus = Table(
    "cluster_alive_gpus", VIEWS,
    Column("node", String(64), primary_key=True), Column("gpu_index", Integer, primary_key=True),
)


@dataclass(frozen=True)
class CheckpointCost:
    """What pausing a job has cost, measured: for pricing a preemption or a migration."""

    pause_s: float  # request to GPUs released, median of its recent pauses (0 if never paused)
    write_s: float  # its newest image's background write (on a migration's critical path)
    logical_bytes: int  # its newest image's state
    pauses: int  # how many pauses the median is over
    copy_s: float = 0.0  # its newest image's copy out of the job (most of a pause, when never paused)


def median_pause(recent_pauses_s: Sequence[float]) -> float:
    """The upper median of the recent pauses (0 when the job was never paused)."""
    ordered = sorted(recent_pauses_s)
    return ordered[len(ordered) // 2] if ordered else 0.0


def resume_image(session: Session, job_id: str) -> str | None:
    """The image a job (re)started now must restore from: its newest complete one, or None.

    Put into LaunchRequest.resume_image when a start commits, so a paused, migrated, lost or
    requeued job continues from its last image wherever it lands.
    """
    return session.scalar(select(resume_images.c.image_id).where(resume_images.c.job_id == job_id))


@dataclass(frozen=True)
class StreamedImage:
    """A migration's image still being written, which its job resumes from meanwhile."""

    image_id: str
    source_address: str  # the agent holding the staged copy ("" when its node is gone)


def streamed_image(session: Session, job_id: str) -> StreamedImage | None:
    """The image a migrated job resumes from while its durable write goes on, or None."""
    row = session.execute(
        select(streamed_images.c.image_id, _nodes.c.address)
        .join(_nodes, _nodes.c.name == streamed_images.c.source_node, isouter=True)
        .where(streamed_images.c.job_id == job_id)
    ).first()
    return StreamedImage(row[0], row[1] or "") if row is not None else None


def checkpoint_costs(session: Session, job_ids: Sequence[str]) -> dict[str, CheckpointCost]:
    """Measured costs of the jobs that have a complete image; a job without one is absent
    (it has never been checkpointed: its cost is unknown, and so is whether it can be)."""
    if not job_ids:
        return {}
    rows = session.execute(select(move_costs).where(move_costs.c.job_id.in_(list(job_ids))))
    return {
        r.job_id: CheckpointCost(median_pause(r.recent_pauses_s), r.write_s, r.logical_bytes,
                                 len(r.recent_pauses_s), r.copy_s)
        for r in rows
    }


def pending_resume_targets(session: Session) -> dict[str, str]:
    """The node each pending job's latest resume or migration asked for (jobs that asked one)."""
    rows = session.execute(
        select(resume_targets.c.job_id, resume_targets.c.target_node)
        .join(_jobs, _jobs.c.id == resume_targets.c.job_id).where(_jobs.c.state == jobstate.PENDING)
    )
    return {job_id: node for job_id, node in rows if node}


def bad_gpus(session: Session) -> dict[str, tuple[int, ...]]:
    """Each node's BAD GPU indices: what the allocator must leave out of every plan."""
    out: dict[str, list[int]] = {}
    rows = session.execute(
        select(bad_gpu_rows.c.node, bad_gpu_rows.c.gpu_index).order_by(bad_gpu_rows.c.node, bad_gpu_rows.c.gpu_index)
    )
    for node, gpu in rows:
        out.setdefault(node, []).append(gpu)
    return {node: tuple(gpus) for node, gpus in out.items()}


def applied_layout(session: Session, job_id: str) -> str:
    """The job's ROTA_LAYOUT: the layout its last applied re-plan gave it; "" when none was."""
    layout = applied_layout_document(session, job_id)
    return layout_json(layout) if layout is not None else ""


def applied_layout_document(session: Session, job_id: str) -> dict[str, Any] | None:
    """The layout its last applied re-plan gave the job, as stored; None when none was."""
    layout = session.scalar(select(applied_layouts.c.layout).where(applied_layouts.c.job_id == job_id))
    return dict(layout) if layout is not None else None


def launch_fields(session: Session, job_id: str) -> dict[str, Any]:
    """What a (re)start of the job carries to its agent, under the field names LaunchRequest
    (the allocator's launch) and Assignment (a heartbeat's answer) share: the image it restores
    from ("" for none) and the layout an applied re-plan gave it (none: no layout fields).
    A migration still writing its image hands the job that image, where to stream it from,
    and the newest complete image to fall back on."""
    complete = resume_image(session, job_id) or ""
    streamed = streamed_image(session, job_id)
    images: dict[str, Any] = {"resume_image": complete}
    if streamed is not None and streamed.source_address:
        images = {"resume_image": streamed.image_id, "resume_source": streamed.source_address,
                  "resume_fallback_image": complete}
    return {**images, **layout_fields(applied_layout_document(session, job_id))}


def gpu_types(session: Session, nodes: Collection[str]) -> dict[tuple[str, int], str]:
    """The type each GPU of these nodes advertised, by (node, index); a GPU not listed (its
    node is gone) or of unknown type is absent, as "" would say the same."""
    if not nodes:
        return {}
    rows = session.execute(
        select(node_gpu_types.c.node, node_gpu_types.c.gpu_index, node_gpu_types.c.gpu_type)
        .where(node_gpu_types.c.node.in_(sorted(nodes)), node_gpu_types.c.gpu_type != "")
    )
    return {(node, index): gpu_type for node, index, gpu_type in rows}
