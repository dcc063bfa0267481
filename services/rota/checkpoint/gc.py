"""Retention and garbage collection of the chunk store, on a loop in the coordinator.

(1) Retention deletes images past each job's newest N complete ones (and those of jobs
finished long enough ago); their manifests and chunk references go with them. (2) A chunk
is collected when no image names it and it was not touched since the cutoff: the grace
period, moved back to the start of the oldest image still being written, so a write in
flight (which touches every chunk it reuses) never loses one. The store's `retire`
settles the last race, a writer touching a chunk while it is being deleted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from rota.checkpoint import repository as repo
from rota.common.db import Database
from rota.imagestore.chunks import ChunkStore
from rota.imagestore.settings import CheckpointSettings

log = logging.getLogger(__name__)
FINISHED_KEEP = timedelta(hours=1)  # images of a finished job outlive it this long


@dataclass(frozen=True)
class GcReport:
    images: int
    chunks: int
    bytes: int


def collect(db: Database, store: ChunkStore, keep: int, grace: timedelta,
            finished_for: timedelta = FINISHED_KEEP) -> GcReport:
    deleted = db.run(lambda s: repo.apply_retention(s, keep, finished_for))
    for image_id in deleted:
        store.delete_manifest(image_id)
    cutoff = db.run(lambda s: repo.gc_cutoff(s, grace))
    cutoff_ts = cutoff.timestamp()
    old = {c.digest: c.size for c in store.chunks() if c.mtime < cutoff_ts}
    named = db.run(lambda s: repo.referenced(s, sorted(old)))
    unnamed = sorted(set(old) - named)
    db.run(lambda s: repo.forget_chunks(s, unnamed, cutoff))
    freed = [d for d in unnamed if store.retire(d, cutoff_ts)]
    return GcReport(len(deleted), len(freed), sum(old[d] for d in freed))


async def run_forever(db: Database, store: ChunkStore, settings: CheckpointSettings) -> None:
    while True:
        await asyncio.sleep(settings.gc_interval_s)
        try:
            report = await asyncio.to_thread(
                collect, db, store, settings.keep, timedelta(seconds=settings.gc_grace_s))
            if report.images or report.chunks:
                log.info("checkpoint gc: %d images, %d chunks (%d bytes) freed", report.images, report.chunks, report.bytes)
        except Exception:  # noqa: BLE001 - the loop outlives any one failure
            log.exception("checkpoint gc failed")
