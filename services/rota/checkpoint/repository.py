"""The coordinator's Postgres operations: images, manifests, chunk references, operations.

Functions take an open Session (one transaction) and never call the network. Other
services never call them: what they read of these tables (resume images, move costs, resume
targets) they read through the views this service publishes (`rota.common.read_models`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, literal_column, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from rota.checkpoint.models import ChunkRow, ImageChunkRow, ImageRow, ManifestRow, OperationRow
from rota.cluster import queries
from rota.cluster.job_lifecycle import utcnow

WRITING, COMPLETE, FAILED = "writing", "complete", "failed"
# Operation states. An operation ends in DONE or FAILED; the others say how far it got.
REQUESTED, COPYING, RESUMING = "requested", "copying", "resuming"
DONE = "done"
ENDED = (DONE, FAILED)
INSERT_BATCH = 1000


def new_image_id() -> str:
    return "img-" + secrets.token_hex(8)


# Images.
def begin_image(session: Session, job_id: str, kind: str, node: str) -> ImageRow:
    """A new image in state `writing`, numbered after the job's last one."""
    last = session.scalar(select(func.max(ImageRow.sequence)).where(ImageRow.job_id == job_id))
    image = ImageRow(id=new_image_id(), job_id=job_id, sequence=(last or 0) + 1, kind=kind, state=WRITING,
                     node=node, ranks=0)
    session.add(image)
    session.flush()
    return image


def complete_image(
    session: Session, image_id: str, manifest: dict[str, Any], *, step: int, copy_s: float, write_s: float
) -> ImageRow | None:
    """Records a written image: its chunks (touched), references, per-rank manifests.

    `stored_bytes` counts the chunks that were new to the store's index: what this image
    added, after deduplication across ranks and against every earlier image.
    """
    image = session.get(ImageRow, image_id, with_for_update=True)
    if image is None or image.state != WRITING:
        return image
    chunks: dict[str, int] = {}
    for rank in manifest["ranks"]:
        for segment in rank["segments"]:
            for digest, length in segment["chunks"]:
                chunks[digest] = int(length)
    stored = 0
    items = sorted(chunks.items())
    for start in range(0, len(items), INSERT_BATCH):
        batch = items[start: start + INSERT_BATCH]
        stmt = insert(ChunkRow).values([{"hash": h, "size": n} for h, n in batch])
        stmt = stmt.on_conflict_do_update(index_elements=["hash"], set_={"touched_at": func.now()})
        # xmax = 0 on a row this statement inserted (rather than updated): a new chunk.
        rows: Sequence[Any] = session.execute(stmt.returning(ChunkRow.size, literal_column("(xmax = 0)"))).all()
        stored += sum(int(size) for size, inserted in rows if inserted)
        session.execute(insert(ImageChunkRow).values([{"image_id": image_id, "chunk": h} for h, _ in batch]))
    for rank in manifest["ranks"]:
        session.add(ManifestRow(image_id=image_id, rank=int(rank["rank"]), entries=rank, logical_bytes=_logical(rank)))
    image.state, image.completed_at = COMPLETE, utcnow()
    image.ranks, image.step = len(manifest["ranks"]), step
    image.logical_bytes = sum(_logical(r) for r in manifest["ranks"])
    image.stored_bytes, image.chunks = stored, len(chunks)
    image.copy_s, image.write_s = copy_s, write_s
    session.flush()
    return image


def _logical(rank: dict[str, Any]) -> int:
    """The state a rank stands for: replicated shares that other ranks wrote included."""
    return int(rank.get("logical_bytes", sum(s["length"] for s in rank["segments"])))


def fail_image(session: Session, image_id: str, error: str) -> None:
    session.execute(
        update(ImageRow).where(ImageRow.id == image_id, ImageRow.state == WRITING)
        .values(state=FAILED, error=error[:4000], completed_at=utcnow())
    )


def set_image_copy(session: Session, image_id: str, *, step: int, ranks: int, copy_s: float, logical: int) -> None:
    session.execute(update(ImageRow).where(ImageRow.id == image_id)
                    .values(step=step, ranks=ranks, copy_s=copy_s, logical_bytes=logical))


def latest_image(session: Session, job_id: str) -> ImageRow | None:
    return session.scalars(
        select(ImageRow).where(ImageRow.job_id == job_id, ImageRow.state == COMPLETE)
        .order_by(ImageRow.sequence.desc()).limit(1)
    ).first()


def pending_write(session: Session, job_id: str) -> ImageRow | None:
    """An image of the job still being written (a pause's), newest first."""
    return session.scalars(
        select(ImageRow).where(ImageRow.job_id == job_id, ImageRow.state == WRITING)
        .order_by(ImageRow.sequence.desc()).limit(1)
    ).first()


@dataclass(frozen=True)
class ImageView:
    image: ImageRow
    unique_bytes: int


def list_images(session: Session, job_id: str) -> list[ImageView]:
    unique = (
        select(ImageChunkRow.image_id, func.coalesce(func.sum(ChunkRow.size), 0).label("unique"))
        .join(ChunkRow, ChunkRow.hash == ImageChunkRow.chunk).group_by(ImageChunkRow.image_id).subquery()
    )
    rows = session.execute(
        select(ImageRow, func.coalesce(unique.c.unique, 0))
        .outerjoin(unique, unique.c.image_id == ImageRow.id)
        .where(ImageRow.job_id == job_id).order_by(ImageRow.sequence)
    ).all()
    return [ImageView(image, int(u)) for image, u in rows]


def manifest_of(session: Session, image_id: str) -> dict[str, Any]:
    ranks = session.scalars(select(ManifestRow).where(ManifestRow.image_id == image_id).order_by(ManifestRow.rank)).all()
    return {"ranks": [r.entries for r in ranks]}


# Retention and garbage collection.
def apply_retention(session: Session, keep: int, finished_for: timedelta) -> list[str]:
    """Deletes images beyond each job's newest `keep` complete ones, failed images once a
    newer complete one exists, and every image of a job finished for `finished_for`.
    Never one being written, and never a live job's newest complete image."""
    doomed: list[str] = []
    ranked = (
        select(ImageRow.id, ImageRow.job_id, ImageRow.state, ImageRow.sequence,
               func.row_number().over(partition_by=(ImageRow.job_id, ImageRow.state),
                                      order_by=ImageRow.sequence.desc()).label("n"))
        .subquery()
    )
    for image_id, _job, state, _seq, n in session.execute(select(ranked)).all():
        if state == COMPLETE and n > keep:
            doomed.append(image_id)
    newest_complete = dict(session.execute(
        select(ImageRow.job_id, func.max(ImageRow.sequence)).where(ImageRow.state == COMPLETE).group_by(ImageRow.job_id)
    ).all())
    for image in session.scalars(select(ImageRow).where(ImageRow.state == FAILED)):
        if image.sequence < newest_complete.get(image.job_id, 0):
            doomed.append(image.id)
    cutoff = utcnow() - finished_for
    finished = queries.finished_before(cutoff)
    doomed += session.scalars(
        select(ImageRow.id).where(ImageRow.job_id.in_(finished), ImageRow.state != WRITING)
    ).all()
    doomed = sorted(set(doomed))
    if doomed:
        session.execute(delete(ImageRow).where(ImageRow.id.in_(doomed)))
    return doomed


def gc_cutoff(session: Session, grace: timedelta) -> datetime:
    """Chunks touched at or after this may belong to a write in flight: never collect them."""
    oldest_writing = session.scalar(select(func.min(ImageRow.created_at)).where(ImageRow.state == WRITING))
    cutoff = utcnow() - grace
    return min(cutoff, oldest_writing) if oldest_writing is not None else cutoff


def referenced(session: Session, digests: Sequence[str]) -> set[str]:
    out: set[str] = set()
    for start in range(0, len(digests), INSERT_BATCH):
        batch = list(digests[start: start + INSERT_BATCH])
        out.update(session.scalars(select(ImageChunkRow.chunk).where(ImageChunkRow.chunk.in_(batch)).distinct()))
    return out


def forget_chunks(session: Session, digests: Sequence[str], cutoff: datetime) -> list[str]:
    """Deletes the index rows of unreferenced chunks not touched since `cutoff`.

    The foreign key from checkpoint_image_chunks is RESTRICT, and the NOT EXISTS is
    re-checked under the row lock, so a chunk an image names can never lose its row.
    """
    gone: list[str] = []
    for start in range(0, len(digests), INSERT_BATCH):
        batch = list(digests[start: start + INSERT_BATCH])
        named = select(ImageChunkRow.chunk).where(ImageChunkRow.chunk == ChunkRow.hash).exists()
        stmt = (delete(ChunkRow).where(ChunkRow.hash.in_(batch), ChunkRow.touched_at < cutoff, ~named)
                .returning(ChunkRow.hash))
        gone += session.scalars(stmt).all()
    return gone


# Operations.
def find_operation(session: Session, request_id: str) -> OperationRow | None:
    if not request_id:
        return None
    return session.scalars(select(OperationRow).where(OperationRow.request_id == request_id)).first()


def create_operation(session: Session, job_id: str, kind: str, request_id: str, **values: Any) -> OperationRow:
    op = OperationRow(job_id=job_id, kind=kind, state=REQUESTED, request_id=request_id or None, **values)
    session.add(op)
    session.flush()
    return op


def set_operation(session: Session, op_id: int, state: str, **values: Any) -> None:
    extra: dict[str, Any] = {"updated_at": utcnow()}
    if state in ENDED:
        extra["finished_at"] = utcnow()
    session.execute(update(OperationRow).where(OperationRow.id == op_id).values(state=state, **values, **extra))


def merge_detail(session: Session, op_id: int, **detail: Any) -> None:
    op = session.get(OperationRow, op_id, with_for_update=True)
    if op is not None:
        op.detail = {**op.detail, **detail}


def unfinished_operations(session: Session) -> Sequence[OperationRow]:
    return session.scalars(select(OperationRow).where(OperationRow.state.notin_(ENDED)).order_by(OperationRow.id)).all()


def active_operations(session: Session, job_id: str) -> Sequence[OperationRow]:
    return session.scalars(
        select(OperationRow).where(OperationRow.job_id == job_id, OperationRow.state.notin_(ENDED))
        .order_by(OperationRow.id)
    ).all()


def recent_operations(session: Session, job_id: str, limit: int = 20) -> Sequence[OperationRow]:
    return session.scalars(
        select(OperationRow).where(OperationRow.job_id == job_id).order_by(OperationRow.id.desc()).limit(limit)
    ).all()


def running_jobs_due(session: Session, interval: timedelta) -> list[tuple[str, str, int]]:
    """Running jobs whose newest image (or start) is older than `interval`: (id, node, epoch)."""
    cutoff = utcnow() - interval
    running = queries.running_jobs(session)
    newest = dict(session.execute(
        select(ImageRow.job_id, func.max(ImageRow.created_at))
        .where(ImageRow.job_id.in_([job_id for job_id, *_ in running])).group_by(ImageRow.job_id)
    ).tuples().all()) if running else {}
    rows = [(job_id, node, epoch, started, newest.get(job_id)) for job_id, node, epoch, started in running]
    return [(job_id, node, epoch) for job_id, node, epoch, started, at in rows
            if node and (at or started or cutoff) < cutoff]
