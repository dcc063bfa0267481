"""Progress reports from a running job to its node agent, and the job's view of its placement.

Protocol with the agent (fixed): when ``ROTA_PROGRESS_FILE`` is set, every call to
:func:`report` appends exactly one JSON object, on one line, holding only the values the
job passed, and the line is written with a single ``write`` on a file opened in append
mode, so the agent, which tails the last complete line, never sees half a report. When the
variable is unset (the script runs outside Rota) :func:`report` only validates.

Values are kept exactly: floats are written with Python's shortest round-trip repr, never
rounded. Non-finite numbers and anything JSON cannot hold are refused with a ValueError
that names the key.

This module is pure standard library; ``torch`` is imported lazily, only by
:meth:`JobContext.device`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENV_EPOCH",
    "ENV_GPUS",
    "ENV_JOB_ID",
    "ENV_NODE",
    "ENV_PROGRESS_FILE",
    "MAX_REPORT_BYTES",
    "JobContext",
    "job_context",
    "report",
]

ENV_PROGRESS_FILE = "ROTA_PROGRESS_FILE"
ENV_JOB_ID = "ROTA_JOB_ID"
ENV_NODE = "ROTA_NODE"
ENV_GPUS = "ROTA_GPUS"
ENV_EPOCH = "ROTA_EPOCH"

#: One report (one line) may hold at most this many bytes of JSON.
MAX_REPORT_BYTES = 64 * 1024

_MAX_DEPTH = 16


def _normalise(key: str, value: Any, depth: int = 0) -> Any:
    """Return ``value`` as plain JSON data, or raise ValueError naming ``key``.

    Scalars that are not Python numbers but behave like one (numpy scalars, 0-d torch
    tensors) are converted through their ``item()``, which keeps their exact value.
    """
    if depth > _MAX_DEPTH:
        raise ValueError(f"progress value {key!r} is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"progress value {key!r} is not finite: {value!r}")
        return float(value)
    if isinstance(value, Mapping):
        return _normalise_mapping(key, value, depth)
    if isinstance(value, list | tuple):
        return [_normalise(f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value)]
    scalar = _scalar_item(key, value)
    if scalar is not None:
        return _normalise(key, scalar, depth + 1)
    raise ValueError(
        f"progress value {key!r} of type {type(value).__name__} cannot be written as JSON "
        "(use numbers, strings, booleans, None, lists or dicts of them)"
    )


def _normalise_mapping(key: str, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise ValueError(f"progress value {key!r} has a non-string key {k!r}; JSON keys are strings")
        out[k] = _normalise(f"{key}.{k}", v, depth + 1)
    return out


def _scalar_item(key: str, value: Any) -> bool | int | float | None:
    """The number a scalar-like value (numpy scalar, 0-d tensor) holds through its ``item()``;
    None when it has no ``item()`` or that is no number."""
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    try:
        scalar = item()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(
            f"progress value {key!r} of type {type(value).__name__} is not a single number: {exc}"
        ) from None
    return scalar if isinstance(scalar, bool | int | float) else None


def _encode(values: Mapping[str, Any]) -> bytes:
    if not values:
        raise ValueError("report() needs at least one value, e.g. report(step=10, loss=2.3)")
    clean = {key: _normalise(key, value) for key, value in values.items()}
    line = json.dumps(clean, allow_nan=False, separators=(", ", ": "), ensure_ascii=False)
    data = (line + "\n").encode("utf-8")
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"progress report is {len(data)} bytes; at most {MAX_REPORT_BYTES} are allowed")
    return data


def _append_line(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def report(**values: Any) -> None:
    """Report the job's progress, e.g. ``report(step=300, loss=2.31)``.

    The values show up as the job's ``progress`` in ``rota job ID``. Raises ValueError,
    naming the key, for a value that is not finite or cannot be written as JSON.
    """
    data = _encode(values)
    path = os.environ.get(ENV_PROGRESS_FILE)
    if path:
        _append_line(path, data)


def _parse_gpus(raw: str) -> tuple[int, ...]:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        gpus = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{ENV_GPUS} must be a comma-separated list of integers, got {raw!r}") from None
    if any(g < 0 for g in gpus):
        raise ValueError(f"{ENV_GPUS} must hold non-negative GPU indexes, got {raw!r}")
    return gpus


def _parse_epoch(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{ENV_EPOCH} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class JobContext:
    """Where and as what this process runs, as its node agent told it through ``ROTA_*``.

    Outside Rota every field is empty: ``job_id`` and ``node`` are None, ``gpus`` is ``()``.
    """

    job_id: str | None
    node: str | None
    gpus: tuple[int, ...]
    epoch: int | None

    @property
    def managed(self) -> bool:
        """True when the process was launched by a Rota agent."""
        return self.job_id is not None

    def device(self) -> str:
        """``"cuda"`` when torch sees CUDA and ``CUDA_VISIBLE_DEVICES`` is non-empty, else ``"cpu"``."""
        if not os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
            return "cpu"
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"


def job_context() -> JobContext:
    """Read the job's context from the environment (at call time; nothing is cached)."""
    env = os.environ
    return JobContext(
        job_id=env.get(ENV_JOB_ID) or None,
        node=env.get(ENV_NODE) or None,
        gpus=_parse_gpus(env.get(ENV_GPUS, "")),
        epoch=_parse_epoch(env.get(ENV_EPOCH)),
    )
