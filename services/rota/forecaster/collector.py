"""Every finished job becomes an observation the models learn from (SPEC §5)."""

from __future__ import annotations

import asyncio
import logging

from rota.common.db import Database
from rota.forecaster import repository

log = logging.getLogger(__name__)


class CompletionCollector:
    def __init__(self, db: Database, interval_s: float) -> None:
        self.db = db
        self.interval_s = interval_s

    async def run_forever(self) -> None:
        while True:
            try:
                recorded = await asyncio.to_thread(self.db.run, repository.observe_finished_jobs)
                if recorded:
                    log.info("observed %d finished jobs", recorded)
            except Exception as exc:  # noqa: BLE001 - the next round retries; nothing is lost
                log.warning("observing finished jobs failed: %s", exc)
            await asyncio.sleep(self.interval_s)
