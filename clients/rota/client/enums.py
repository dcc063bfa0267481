"""States and kinds read off the wire: the enum a server fills from 0.2.0 on, else the string.

Since 0.2.0 every state or kind the services send travels twice: as an enum (e.g.
`CheckpointImage.image_state`) and as the string it replaces (`state`, deprecated, gone in
0.3.0). The SDK reads the enum and gives the same string the string field holds ("complete",
"BAD", "PENDING", ...), so what callers and `--json` output see does not change; from a
server older than 0.2.0 the enum is UNSPECIFIED and the string is read instead, as it is for
a value newer than this SDK.
"""

from __future__ import annotations

from typing import Any

__all__ = ["enum_name"]


def enum_name(enum: Any, value: int, prefix: str, fallback: str, *, lower: bool = False) -> str:
    """The name of `value` in `enum` without `prefix` (lower-cased with `lower`), or `fallback`
    (the deprecated string field) when it is 0 (UNSPECIFIED) or unknown to this SDK."""
    if not value:
        return fallback
    try:
        name: str = enum.Name(value)
    except ValueError:
        return fallback
    name = name.removeprefix(prefix)
    return name.lower() if lower else name
