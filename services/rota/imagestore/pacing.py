"""Rate caps for checkpoint traffic: the background write and the streams to targets.

A pause's image is written, and a migration's state streamed, while training goes on on
the same machines; an operator caps either so it does not take the disk or the link the
job shares (ROTA_CHECKPOINT_WRITE_MBPS, ROTA_CHECKPOINT_STREAM_MBPS). `RateCap` is pure:
the caller passes the clock's time in and sleeps (or awaits) the delay it gets back.
"""

from __future__ import annotations

import threading


class RateCap:
    """At most `mbps` MB/s over every caller sharing it (0: no cap)."""

    def __init__(self, mbps: float) -> None:
        self.rate = mbps * 1e6
        self._next = 0.0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, now: float) -> float:
        """Seconds to wait before sending `nbytes`, booked from `now` (monotonic)."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            start = max(now, self._next)
            self._next = start + nbytes / self.rate
        return start - now
