"""Slurm's numeric job ids for Rota's ids, and Slurm's compressed node lists.

A Rota job or array id is `j-` and ten hex digits (40 random bits, rota.cluster's
new_job_id); its Slurm number is those digits read as a decimal number, so the mapping
needs no table and holds across restarts of anything: `j-00000004d2` is 1234. A task of an
array is `NUMBER_INDEX`, as in Slurm.
"""

from __future__ import annotations

import re

_ROTA_ID = re.compile(r"^j-([0-9a-f]{10})(?:_(\d+))?$")
_SLURM_ID = re.compile(r"^(\d+)(?:_(\d+))?$")
HEX_DIGITS = 10


class SlurmIdError(ValueError):
    """A job id that is neither Slurm's number (`N`, `N_I`) nor a Rota id."""


def slurm_id(rota_id: str) -> str:
    """`j-00000004d2` -> "1234", `j-00000004d2_7` -> "1234_7"."""
    found = _ROTA_ID.match(rota_id)
    if found is None:
        raise SlurmIdError(f"job id {rota_id!r}: not a Rota job id (j- and ten hex digits)")
    number = str(int(found.group(1), 16))
    return number if found.group(2) is None else f"{number}_{found.group(2)}"


def rota_id(text: str) -> str:
    """Slurm's `1234` or `1234_7` (or a Rota id, kept) -> the Rota id."""
    if _ROTA_ID.match(text):
        return text
    found = _SLURM_ID.match(text.strip())
    if found is None:
        raise SlurmIdError(f"job id {text!r}: expected a number such as 1234 or an array task such as 1234_7")
    number = int(found.group(1))
    if number >= 16**HEX_DIGITS:
        raise SlurmIdError(f"job id {text!r}: no Rota job has a number that large")
    base = f"j-{number:0{HEX_DIGITS}x}"
    return base if found.group(2) is None else f"{base}_{int(found.group(2))}"


_NAME = re.compile(r"^(.*?)(\d+)$")


def compress_nodes(names: list[str]) -> str:
    """Slurm's hostlist form: ["n1", "n2", "n3", "gpu07", "x"] -> "n[1-3],gpu07,x".

    Names sharing a prefix and a digit width are grouped, in the order first seen; runs of
    consecutive numbers become ranges, zero padding kept."""
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        found = _NAME.match(name)
        if found is None:
            order.append(name)
            continue
        digits = found.group(2)
        key = (found.group(1), len(digits) if digits.startswith("0") else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        if int(digits) not in groups[key]:
            groups[key].append(int(digits))
    return ",".join(item if isinstance(item, str) else _group(item, groups[item]) for item in order)


def _group(key: tuple[str, int], numbers: list[int]) -> str:
    prefix, width = key
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    numbers = sorted(numbers)
    runs: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        runs.append(f"{start:0{width}d}" if start == previous else f"{start:0{width}d}-{previous:0{width}d}")
        if number is not None:
            start = previous = number
    return f"{prefix}[{','.join(runs)}]"
