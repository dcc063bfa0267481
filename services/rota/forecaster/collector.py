"""What the models learn from (docs/design.md §5): every finished job, and running realtime apps'
request counters as traffic samples."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from rota.common.db import Database
from rota.forecaster import repository

log = logging.getLogger(__name__)


class CompletionCollector:
    def __init__(self, db: Database, interval_s: float, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.interval_s = interval_s
        self.clock = clock
        self._served: dict[str, float] = {}  # job id -> the counter at the last sample

    async def run_forever(self) -> None:
        while True:
            try:
                recorded = await asyncio.to_thread(self.db.run, repository.observe_finished_jobs)
                if recorded:
                    log.info("observed %d finished jobs", recorded)
                await asyncio.to_thread(self.db.run, self.sample_traffic)
            except Exception as exc:  # noqa: BLE001 - the next round retries; nothing is lost
                log.warning("observing finished jobs failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    def sample_traffic(self, session: Session) -> int:
        """Requests each app served since the last sample, as traffic at this moment.

        The first sample of an app (or of a restarted collector) only sets the baseline, so
        a restart under-counts one interval at most and never counts a request twice; each
        sample's key names the job and the second, so a retried write is a no-op.
        """
        now = int(self.clock())
        recorded = 0
        seen: dict[str, float] = {}
        for job_id, app, served in repository.serving_counters(session):
            seen[job_id] = served
            before = self._served.get(job_id)
            if before is not None and served > before:
                recorded += repository.record_traffic(
                    session, key=f"traffic:{app}:{job_id}:{now}", app=app, at_unix=now, requests=served - before)
        self._served = seen
        return recorded
