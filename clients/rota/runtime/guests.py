"""The trials a pipeline job's agent placed in its bubbles (its guests), for it to squeeze.

The allocator places a ``kind: trial`` job as a guest of a running job that reports its
bubbles (``rota.runtime.report(step_s=..., bubble_s=...)``); the agent starts the trial
on the host's GPUs at idle priority and lists the trial's process group in the host's
``ROTA_BUBBLE_GUESTS_FILE``. The host's stage stops those groups at each compute start and
resumes them at each compute end (``rota.jobkit.tuning.bubbles.BubbleClock(squeeze_pgids=...)``),
so the trial runs only inside the bubbles. ``bubble_guests()`` is cheap enough to call
every step: the file is read again only when it changed.
"""

from __future__ import annotations

import json
import os

ENV_GUESTS_FILE = "ROTA_BUBBLE_GUESTS_FILE"
ENV_GUEST_OF = "ROTA_GUEST_OF"

_seen: tuple[str, int, tuple[int, ...]] | None = None  # path, mtime (ns), process groups


def bubble_guests() -> tuple[int, ...]:
    """The process groups of this job's guests now; () outside Rota or with none."""
    global _seen
    path = os.environ.get(ENV_GUESTS_FILE)
    if not path:
        return ()
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return ()
    if _seen is not None and _seen[:2] == (path, mtime):
        return _seen[2]
    try:
        with open(path, encoding="utf-8") as f:
            groups = tuple(int(g) for g in json.load(f).get("pgids", ()))
    except (OSError, ValueError, TypeError, AttributeError):
        return ()  # half-written by an older agent, or not ours: no guests this step
    _seen = (path, mtime, groups)
    return groups


def guest_of() -> str:
    """The host job whose bubbles this job runs in, or '' (not a guest)."""
    return os.environ.get(ENV_GUEST_OF, "")
