"""The pure CONCUR controller (`rota.jobkit.inference.kv_window`) run against a scraped `/metrics` page,
and an admit/release endpoint for agent frameworks outside Rota.

``ScrapedAdmission`` owns a controller and a metrics URL (this package's engine, a vLLM or
an SGLang server): each ``tick(now)`` scrapes once and applies the control law; a scrape
that fails leaves the window where it is (the decision says so). Its ``request`` and
``release`` are the controller's, behind a lock, since HTTP handlers call them from their
threads.

``admission_routes`` gives the routes a job serves next to ``/metrics``:

    POST /admit?agent=ID[&tokens=N] -> {"admitted": true|false, "window": W, "active": n, "held": n}
    POST /release?agent=ID  -> {"admitted": [IDs now holding the freed slots], ...}
    GET  /window            -> {"window": W, "active": n, "held": n, "last": {decision}}

An agent calls ``/admit`` at each step boundary (before each generation) and goes on when
it says ``admitted`` (``tokens``: what its request will hold in the cache, its history and the
tokens it generates; with it the controller admits it only where it fits); otherwise it asks again later (it keeps its place in the queue), and
calls ``/release`` once it is done.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs

from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, Decision
from rota.jobkit.inference.scrape import scrape

__all__ = ["ScrapedAdmission", "admission_routes"]


class ScrapedAdmission:
    def __init__(self, controller: AdmissionController, metrics_url: str,
                 source: Callable[[], CacheSample | None] | None = None, timeout_s: float = 1.0) -> None:
        self.controller = controller
        self.metrics_url = metrics_url
        self._source = source or (lambda: scrape(metrics_url, timeout_s))
        self._lock = threading.Lock()
        self.last: Decision | None = None

    def tick(self, now: float) -> Decision:
        """Scrape once and apply the control law."""
        return self.observe(self._source(), now)

    def observe(self, sample: CacheSample | None, now: float) -> Decision:
        with self._lock:
            self.last = self.controller.observe(sample, now)
            return self.last

    @property
    def active(self) -> tuple[str, ...]:
        with self._lock:
            return self.controller.active

    def request(self, agent: str, tokens: int | None = None) -> bool:
        with self._lock:
            return self.controller.request(agent, tokens)

    def served(self, agent: str, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self.controller.served(agent, prompt_tokens, cached_tokens)

    def release(self, agent: str) -> tuple[str, ...]:
        with self._lock:
            return self.controller.release(agent)

    def status(self) -> dict[str, Any]:
        with self._lock:
            c = self.controller
            out: dict[str, Any] = {"window": c.window, "active": len(c.active), "held": len(c.held)}
            if self.last is not None:
                out["last"] = asdict(self.last)
            return out


def admission_routes(admission: ScrapedAdmission) -> dict[str, Callable[[str, str], tuple[int, str]]]:
    def agent_of(query: str) -> str | None:
        values = parse_qs(query).get("agent", [])
        return values[0] if values and values[0] else None

    def admit(method: str, query: str) -> tuple[int, str]:
        agent = agent_of(query)
        if method != "POST" or agent is None:
            return 400, json.dumps({"error": "agent: POST /admit?agent=ID"})
        # blanks kept: "tokens=" is a bad count, not none; ASCII digits only, as str.isdigit
        # also takes digits int() refuses ("²")
        raw = parse_qs(query, keep_blank_values=True).get("tokens", [None])[0]
        if raw is not None and not (raw.isascii() and raw.isdigit() and int(raw) > 0):
            return 400, json.dumps({"error": f"tokens: must be a positive integer, got {raw!r}"})
        admitted = admission.request(agent, None if raw is None else int(raw))
        return 200, json.dumps({"admitted": admitted, **admission.status()})

    def release(method: str, query: str) -> tuple[int, str]:
        agent = agent_of(query)
        if method != "POST" or agent is None:
            return 400, json.dumps({"error": "agent: POST /release?agent=ID"})
        handed = admission.release(agent)
        return 200, json.dumps({"admitted": list(handed), **admission.status()})

    def window(method: str, query: str) -> tuple[int, str]:
        return 200, json.dumps(admission.status())

    return {"/admit": admit, "/release": release, "/window": window}
