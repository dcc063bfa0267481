"""Human-readable tables and the one-line error format of the CLI."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

ELLIPSIS = "..."  # ASCII: a terminal or log without UTF-8 shows it as well
_OPEN, _CLOSE = "([{", ")]}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def fail(message: str, code: int = 1, detail: str = "") -> int:
    """`rota: MESSAGE` as one line on stderr (what scripts read), then `detail`, if any,
    indented under it as it was written."""
    first_line = " ".join(message.strip().splitlines()) or "error"
    print(f"rota: {first_line}", file=sys.stderr)
    for line in detail.rstrip().splitlines():
        print(f"  {line}", file=sys.stderr)  # a blank one too: every line under it starts indented
    return code


def ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = (datetime.now(UTC) - when.replace(tzinfo=when.tzinfo or UTC)).total_seconds()
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def progress_text(progress: dict[str, Any]) -> str:
    parts = []
    for key, value in progress.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters: cut at a space outside brackets, so a phrase
    such as `(in ~1m)` stays whole or goes, with `...` in place of the rest."""
    if len(text) <= width:
        return text
    room = width - len(ELLIPSIS)
    depth, cut = 0, 0
    for i, ch in enumerate(text[: room + 1]):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            cut = i
    # One word longer than the room (no space to cut at): a hard cut is all that fits.
    head = text[:cut].rstrip(" ,;:") if cut else text[: max(0, room)]
    return head + ELLIPSIS


class LiveScreen:
    """Shows successive frames of a table: redrawn in place on a terminal (ANSI), else each
    frame printed after the last with a blank line between them (a log or a pipe)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.last: str | None = None

    def show(self, text: str, *, only_changed: bool = False) -> None:
        if only_changed and text == self.last:
            return
        if self.tty:
            # Home, each line over the old one (clearing its tail), then clear what is below:
            # no blank flash between frames as a whole-screen clear gives.
            body = "".join(line + "\033[K\n" for line in text.splitlines())
            self.out.write("\033[H" + body + "\033[J")
        else:
            self.out.write(("\n" if self.last is not None else "") + text + "\n")
        self.out.flush()
        self.last = text


def ticks(
    interval_s: float, count: int = 0, *,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> Iterator[int]:
    """0, 1, 2, ... one every `interval_s` seconds counted from the start, so a slow refresh
    does not push the later ones back; `count` of them (0: without end)."""
    start = clock()
    i = 0
    while not count or i < count:
        if i:
            sleep(max(0.0, start + i * interval_s - clock()))
        yield i
        i += 1
