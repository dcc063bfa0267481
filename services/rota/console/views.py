"""The console's HTML: Jinja2 templates (autoescaped) from this package's `templates/`, and
the few filters they share. Pages are whole documents rendered on the server; the one
script (static/console.js) only refreshes the plan grid and a running job's state."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from rota.client.ledger import fairness_text
from rota.console.params import KINDS, STATES

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml", ".ico": "image/x-icon"}


def ago(value: datetime | str | None) -> str:
    """"12s ago", "5m ago", "3.2h ago"; "-" when unknown."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.removesuffix("Z"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 120:
        return f"{max(seconds, 0):.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.1f}d ago"


def when(value: datetime | None) -> str:
    """A UTC time to the second with its zone, as the CLI writes it (2026-12-01T16:58:54Z)."""
    if value is None:
        return "-"
    return (value.astimezone(UTC) if value.tzinfo else value).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(value: float | None) -> str:
    if not value:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def size(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value = value / 1024  # type: ignore[assignment]
    return str(value)


class Views:
    def __init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        )
        self.env.filters.update(ago=ago, when=when, seconds=seconds, number=number, size=size, fairness=fairness_text)
        # The filters' choices: the SDK's states and kinds (rota.client.enums), in their order.
        self.env.globals.update(job_states=STATES, job_kinds=KINDS)

    def render(self, template: str, **context: Any) -> str:
        return self.env.get_template(template).render(**context)


def static_file(name: str) -> tuple[bytes, str] | None:
    """A file of static/ by its plain name (no folders: nothing else can be asked for)."""
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        return None
    return path.read_bytes(), STATIC_TYPES[path.suffix]
