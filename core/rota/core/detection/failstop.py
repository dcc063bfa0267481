"""Fail-stop: a source silent past its timeout is dead (pure; docs/design.md §7).

A source is one heartbeat stream (a job rank). It counts as dead once, when `now` is more
than its timeout after its last beat; a source whose stream ended is forgotten, not
declared dead: a finished or stopped rank says goodbye, a hung one just goes quiet.
The timeout defaults to three beat intervals, so one or two lost beats are tolerated.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from rota.core.errors import InvalidArgument

TIMEOUT_INTERVALS = 3


@dataclass
class Silent:
    source: Hashable
    last_beat: float
    silent_s: float
    timeout_s: float


@dataclass
class HeartbeatMonitor:
    default_interval_s: float = 1.0
    last: dict[Hashable, float] = field(default_factory=dict)
    timeouts: dict[Hashable, float] = field(default_factory=dict)
    dead: set[Hashable] = field(default_factory=set)

    def timeout_for(self, interval_s: float | None) -> float:
        interval = interval_s if interval_s and interval_s > 0 else self.default_interval_s
        if not interval > 0:
            raise InvalidArgument("interval_seconds", f"must be positive (got {interval})")
        return TIMEOUT_INTERVALS * interval

    def beat(self, source: Hashable, at: float, interval_s: float | None = None) -> None:
        """A beat; a source declared dead that beats again (later) is alive, and may die again."""
        if source in self.dead and at <= self.last.get(source, at):
            return
        self.last[source] = max(at, self.last.get(source, at))
        self.timeouts[source] = self.timeout_for(interval_s)
        self.dead.discard(source)

    def end(self, source: Hashable) -> None:
        self.last.pop(source, None)
        self.timeouts.pop(source, None)
        self.dead.discard(source)

    def expired(self, now: float) -> list[Silent]:
        """Sources that went silent past their timeout since the last call (each once)."""
        out = []
        for source, last in self.last.items():
            timeout = self.timeouts[source]
            if source not in self.dead and now - last > timeout:
                self.dead.add(source)
                out.append(Silent(source, last, now - last, timeout))
        return out
