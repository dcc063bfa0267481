"""Resource quantities as job files write them, and as reasons print them (pure).

`memory: 4Gi` is a Kubernetes-style quantity: a number with an optional suffix, binary
(Ki, Mi, Gi, Ti, Pi, Ei: powers of 1024) or decimal (k, M, G, T, P, E: powers of 1000); a
plain number is bytes. `parse_memory` turns one into bytes or says why it cannot;
`format_bytes` prints bytes as a person reads them (`4 GiB`) in the agent's OOM reason;
`format_limit` prints a time limit as `timedelta` does (`0:10:00`).
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_MEMORY_BYTES", "MAX_CPUS", "format_bytes", "format_limit", "memory_problem", "parse_memory"]

_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")
# Past any node's memory (1 EiB): a larger figure is a typo, and the kernel's limit is an int64.
MAX_MEMORY_BYTES = 2**60
MAX_CPUS = 4096.0  # past any node's core count
_EXAMPLES = "a quantity such as 256Mi, 4Gi or 1.5G"


def memory_problem(value: object) -> str | None:
    """Why `value` is not a memory quantity of at least one byte, or None when it is."""
    bytes_or_reason = _parse(value)
    return bytes_or_reason if isinstance(bytes_or_reason, str) else None


def parse_memory(value: object) -> int:
    """Bytes of a memory quantity (`"4Gi"`, `"256Mi"`, `"1.5G"`, `1073741824`); ValueError
    with the reason for anything else (a negative, zero, unknown suffix, not a number)."""
    bytes_or_reason = _parse(value)
    if isinstance(bytes_or_reason, str):
        raise ValueError(bytes_or_reason)
    return bytes_or_reason


def _parse(value: object) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return f"must be {_EXAMPLES} (got {value!r})"
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        if match is None:
            return f"cannot read {value!r} as {_EXAMPLES}"
        number, suffix = float(match.group(1)), match.group(2)
        if suffix not in _SUFFIXES:
            known = ", ".join(s for s in _SUFFIXES if s)
            return f"unknown suffix {suffix!r} in {value!r} (one of {known}; none: bytes)"
    else:
        number, suffix = float(value), ""
    if not math.isfinite(number) or number <= 0:
        return f"must be positive (got {value!r})"
    total = number * _SUFFIXES[suffix]
    if total > MAX_MEMORY_BYTES:
        return f"more than 1 EiB (got {value!r})"
    if total < 1:
        return f"less than one byte (got {value!r})"
    return int(math.ceil(total))


def format_bytes(n: int) -> str:
    """`4 GiB`, `256 MiB`, `1.5 GiB`, `100 B`: the largest binary unit it has at least one of,
    with up to one decimal (dropped when whole)."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            text = f"{n / size:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{n} B"


def format_limit(seconds: float) -> str:
    """A time limit as `H:MM:SS` (`0:10:00`; days as `1 day, 2:00:00`, whole seconds)."""
    whole = int(round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{secs:02d}"
    if days:
        return f"{days} day{'s' if days > 1 else ''}, {clock}"
    return clock
